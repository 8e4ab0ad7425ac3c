"""Export runs off the GUI thread: the window keeps answering while a report is written,
and its file dialogs open in the user's documents folder."""

from __future__ import annotations

import time
from pathlib import Path

import platformdirs
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QFileDialog

from engine.core.config import RunConfig
from gui.main_window import MainWindow
from tests.gui.clicks import RUN_TIMEOUT_MS, click, fill_form, menu_action

TINY = RunConfig(model="tiny", precisions=("fp32", "bf16"), batch_size=1, seq_len=16, steps=3,
                 warmup=1, device="cpu", isolation="inline")


def test_html_export_leaves_the_event_loop_running(qtbot, monkeypatch, tmp_path):
    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    fill_form(window, TINY)
    with qtbot.waitSignal(window.record_shown, timeout=RUN_TIMEOUT_MS):
        click(window.run_button)
    asked = []

    def save(parent, caption, start, filters):
        asked.append(start)
        return str(tmp_path / "run.html"), filters

    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(save))
    ticks: list[float] = []
    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(time.monotonic()))
    timer.start(5)
    with qtbot.waitSignal(window.exported, timeout=RUN_TIMEOUT_MS) as blocker:
        started = time.monotonic()
        menu_action(window, "File", "Export run as", "HTML report…").trigger()
        returned = time.monotonic()  # the menu action has returned: the writer runs on
    done = time.monotonic()
    timer.stop()
    assert Path(blocker.args[0]) == tmp_path / "run.html"
    assert "<html" in (tmp_path / "run.html").read_text().lower()
    # the timer fired while the report was being written, not only before or after it
    during = [t for t in ticks if returned < t < done]
    assert during, (started, returned, done, ticks[-3:])
    assert returned - started < done - returned
    assert window.statusBar().currentMessage() == f"Report written to {tmp_path / 'run.html'}"
    # the dialog opened in the documents folder with the run's name, not in the checkout
    assert asked == [str(Path(platformdirs.user_documents_dir(),
                              f"ampscope-{window.record.run_id}.html"))]
