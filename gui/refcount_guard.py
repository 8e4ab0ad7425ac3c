"""Work around PySide6 wheels that drop references to None, True and False.

On this project's pinned PySide6 (6.12.0, abi3 wheel) under Python 3.11, every call of a
void Qt method takes one reference from ``None`` and every signal ``emit`` one from
``True``/``False`` without having added it. Python 3.12+ makes these singletons
immortal, so nothing happens there; on 3.10/3.11 the count reaches zero after a few
hundred emits or a few thousand repaints and the interpreter aborts
("none_dealloc: deallocating None"). When a probe shows the defect, the three
singletons get a reference count no session can exhaust (2**40), which is what 3.12's
immortality does for them.
"""

from __future__ import annotations

import ctypes
import sys

_HEADROOM = 2**40
_PROBE_CALLS = 64


def _leaks_none() -> bool:
    from PySide6.QtCore import QObject

    probe = QObject()
    before = sys.getrefcount(None)
    for _ in range(_PROBE_CALLS):
        probe.setObjectName("probe")  # a void method
    return sys.getrefcount(None) <= before - _PROBE_CALLS // 2


def _add_references(obj, count: int) -> bool:
    """Raise ``obj``'s reference count by ``count``; undone if the layout is not the usual one."""
    cell = ctypes.c_ssize_t.from_address(id(obj))  # ob_refcnt leads PyObject in release builds
    before = sys.getrefcount(obj)
    cell.value += count
    if sys.getrefcount(obj) - before != count:
        cell.value -= count
        return False
    return True


def guard() -> bool:
    """Protect the singletons if this PySide6 drops their references; True when applied."""
    if sys.version_info >= (3, 12) or not _leaks_none():
        return False
    return all(_add_references(obj, _HEADROOM) for obj in (None, True, False))


APPLIED = guard()
