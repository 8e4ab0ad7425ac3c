"""The window's background threads at process exit.

A thread still importing the engine (the device probe loads torch, then transformers) when
the process ends fails in its imports: as the main thread finishes, ``threading`` refuses new
exit hooks, and a module that registers one (``concurrent.futures.thread``) raises
"RuntimeError: can't register atexit after shutdown", printed with its traceback over the
end of the user's script. Nobody is left to tell by then: such a thread ends quietly.
"""

from __future__ import annotations

import functools
import sys
import threading


def shutting_down() -> bool:
    """The process is ending (its main thread has finished)."""
    # threading sets this flag as the main thread ends, before any atexit call; it has no
    # public name (3.9 to 3.13 alike)
    return bool(getattr(threading, "_SHUTTING_DOWN", False)) or sys.is_finalizing()


def quiet_at_exit(target):
    """``target`` (a thread's function), which ends without a word when it fails because
    the process is ending; any other failure is raised as before."""
    @functools.wraps(target)
    def run(*args, **kwargs):
        try:
            return target(*args, **kwargs)
        except Exception:
            if shutting_down():
                return None
            raise
    return run
