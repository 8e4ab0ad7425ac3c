"""SIGTERM and SIGHUP close the window the way the user would: the run stops, keeping
what was measured, and its trial process ends with it.

Python runs signal handlers only when the interpreter gets control; a Qt event loop
waiting in C never gives it, so a light timer hands control back a few times a second.
"""

from __future__ import annotations

import signal

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QMainWindow

WAKE_MS = 200


def close_on_signals(window: QMainWindow) -> QTimer:
    def handle(_signum, _frame) -> None:
        window.close()  # closeEvent stops the run and waits for it

    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), handle)
    timer = QTimer(window)
    timer.timeout.connect(lambda: None)
    timer.start(WAKE_MS)
    return timer
