"""A precision name matplotlib would read as a formula (issue #32): the window opens the
journal and its File > Export run as > HTML report writes it, the name as plain text."""

from __future__ import annotations

from PySide6.QtWidgets import QFileDialog

from gui.main_window import MainWindow
from tests.engine.test_runs_read_back import MATH, _journal
from tests.gui.clicks import RUN_TIMEOUT_MS, menu_action


def test_export_of_a_run_whose_precision_reads_as_a_formula(qtbot, monkeypatch, tmp_path):
    journal = _journal(tmp_path / "math.jsonl", precision=MATH)
    out = tmp_path / "math.html"
    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(journal), "")))
    monkeypatch.setattr(QFileDialog, "getSaveFileName",
                        staticmethod(lambda *a, **k: (str(out), "")))
    with qtbot.waitSignal(window.record_shown, timeout=RUN_TIMEOUT_MS):
        menu_action(window, "File", "Open report or journal…").trigger()
    failed, written = [], []
    window.export_failed.connect(failed.append)
    window.exported.connect(written.append)
    menu_action(window, "File", "Export run as", "HTML report…").trigger()
    qtbot.waitUntil(lambda: bool(failed or written), timeout=RUN_TIMEOUT_MS)
    assert failed == [] and str(written[0]) == str(out)
    html = out.read_text()
    assert r"\frac{}{}" in html and "<svg" in html
