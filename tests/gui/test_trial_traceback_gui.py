"""A report whose fp32 trial raised, opened with File > Open: the Trials table shows the
one-line reason, and the Show button on that row opens the full traceback, which Copy puts on
the clipboard. A report from before tracebacks were kept opens without the column."""

from __future__ import annotations

import json

import pytest
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFileDialog

from engine.report.writer import write_report
from gui.main_window import MainWindow
from gui.trial_table import TRACEBACK
from tests.engine.raising_model import MESSAGE, errored_run
from tests.gui.clicks import RUN_TIMEOUT_MS, click, click_tab, menu_action


@pytest.fixture
def reports(tmp_path, monkeypatch):
    """The errored run's JSON report, and the same without the field (an older AmpScope's)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    write_report(errored_run(tmp_path).record, tmp_path / "new.json")
    data = json.loads((tmp_path / "new.json").read_text())
    traceback = data["trials"][0].pop("traceback")
    (tmp_path / "old.json").write_text(json.dumps(data))
    return tmp_path / "new.json", tmp_path / "old.json", traceback


def _open(qtbot, window, monkeypatch, path) -> None:
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(path), "")))
    with qtbot.waitSignal(window.record_shown, timeout=RUN_TIMEOUT_MS):
        menu_action(window, "File", "Open report or journal…").trigger()
    click_tab(window.tabs, "Run")
    click_tab(window.lower_tabs, "Trials")


def test_the_traceback_is_one_click_from_the_errored_trials_reason(qtbot, monkeypatch,
                                                                   reports):
    new, old, traceback = reports
    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    _open(qtbot, window, monkeypatch, new)
    table = window.trial_table
    assert table.cell_text("fp32", "Status") == "error"
    assert table.cell_text("fp32", "Reason") == MESSAGE  # one line by default
    assert not table.isColumnHidden(TRACEBACK)
    click(table.traceback_button("fp32"))
    dialog = table.traceback_dialog
    qtbot.waitUntil(dialog.isVisible)
    shown = dialog.text.toPlainText()
    assert shown == traceback and ", in broken_block" in shown and shown.rstrip().endswith(
        MESSAGE)
    click(dialog.copy_button)
    assert QGuiApplication.clipboard().text() == traceback
    _open(qtbot, window, monkeypatch, old)
    assert table.cell_text("fp32", "Reason") == MESSAGE
    assert table.traceback_button("fp32") is None
    assert table.isColumnHidden(TRACEBACK)
