"""Python's cyclic garbage collector around a process's imports and its exit.

Importing torch and transformers allocates millions of objects, and each full pass of the
collector walks all of them again: on a 2-core machine that was 1.5-2 s of a 7-9 s start
(the CLI's, the trials' forkserver's, a spawned trial's). The interpreter walks the heap
once more as it exits (another 1.5-2 s after the report was written). Nothing imported is
garbage, so the collector is paused while a process imports and the imported objects are
then frozen (``gc.freeze``): every later pass, and the exit's, skips them.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def imports_paused() -> Iterator[None]:
    """No collection while the block imports; afterwards what it left is frozen and the
    collector runs again (also when the block raised)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


def before_exit() -> None:
    """Freeze everything: the interpreter's last collections at exit skip the heap (what
    must happen at exit, atexit handlers and weakref finalizers, still does)."""
    gc.freeze()
