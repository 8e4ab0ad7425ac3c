"""File > Quit during a run asks before stopping it; with no run it quits at once. The
question is answered by clicking its buttons, as a person does."""

from __future__ import annotations

import threading

from PySide6.QtCore import Qt, QTimer
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QMessageBox

from engine.core.config import RunConfig
from gui.main_window import MainWindow
from gui.quit_guard import KEEP_RUNNING, QUESTION, STOP_AND_QUIT, TITLE
from tests.gui.clicks import RUN_TIMEOUT_MS, menu_action


def _answer_with(button_text: str) -> list[tuple[str, str]]:
    """Click ``button_text`` in the next message box to open; its title and text are kept."""
    seen: list[tuple[str, str]] = []
    timer = QTimer(interval=10)

    def answer() -> None:
        box = QApplication.activeModalWidget()
        if not isinstance(box, QMessageBox):
            return
        timer.stop()
        seen.append((box.windowTitle(), box.text()))
        button = next(b for b in box.buttons() if b.text() == button_text)
        QTest.mouseClick(button, Qt.MouseButton.LeftButton)

    timer.timeout.connect(answer)
    timer.start()
    _answer_with.timer = timer  # kept alive until it fires
    return seen


def _running_window(qtbot) -> MainWindow:
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    config = RunConfig(model="tiny", precisions=("fp32",), batch_size=1, seq_len=16,
                       steps=100_000, warmup=0, device="cpu", isolation="inline")
    assert win.start_run(config)
    qtbot.waitUntil(lambda: win.trial_table.progress("fp32") >= 1, timeout=RUN_TIMEOUT_MS)
    return win


def test_quit_during_a_run_asks_and_keep_running_keeps_it(qtbot):
    win = _running_window(qtbot)
    seen = _answer_with(KEEP_RUNNING)
    menu_action(win, "File", "Quit").trigger()
    assert seen == [(TITLE, QUESTION)]
    assert win.isVisible() and win.worker.is_running()
    steps = win.trial_table.progress("fp32")
    qtbot.waitUntil(lambda: win.trial_table.progress("fp32") > steps, timeout=RUN_TIMEOUT_MS)

    seen = _answer_with(STOP_AND_QUIT)
    menu_action(win, "File", "Quit").trigger()
    assert seen == [(TITLE, QUESTION)]
    assert not win.isVisible() and not win.worker.is_running()
    assert "ampscope-run" not in {t.name for t in threading.enumerate()}


def test_quit_with_no_run_asks_nothing(qtbot):
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    seen = _answer_with(STOP_AND_QUIT)
    menu_action(win, "File", "Quit").trigger()
    _answer_with.timer.stop()
    assert seen == [] and not win.isVisible()
