"""The window survives many Qt calls and signal emits (see gui/refcount_guard.py)."""

from PySide6.QtCore import QObject, Signal

import gui  # noqa: F401 (applies the guard)


class _Emitter(QObject):
    ping = Signal(object)


def test_void_calls_and_emits_do_not_exhaust_singletons(qapp):
    # An unguarded Python 3.11 starts with about 5,000 references to None and 400 to
    # True: with the defect and without the guard this loop aborts the interpreter
    received = []
    emitter = _Emitter()
    emitter.ping.connect(received.append)
    calls = 20_000
    for i in range(calls):
        emitter.setObjectName("x")
        emitter.ping.emit(i)
    assert len(received) == calls
