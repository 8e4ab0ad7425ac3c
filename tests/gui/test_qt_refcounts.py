"""The pinned PySide6 keeps Python's singletons alive (6.12.0 did not on Python 3.11).

With a binding that drops a reference to None on each void call, or to True on each
signal emit, the window aborts the interpreter after a few minutes of repaints.
"""

import sys

from PySide6.QtCore import QObject, Signal

CALLS = 2_000


class _Emitter(QObject):
    ping = Signal(object)


def test_void_calls_and_emits_keep_singleton_references(qapp):
    emitter = _Emitter()
    emitter.ping.connect(lambda _value: None)
    none_before, true_before = sys.getrefcount(None), sys.getrefcount(True)
    for i in range(CALLS):
        emitter.setObjectName("x")  # a void method
        emitter.ping.emit(i)
    # a correct binding leaves the counts where they were, give or take a few
    assert sys.getrefcount(None) > none_before - CALLS // 2
    assert sys.getrefcount(True) > true_before - CALLS // 2
