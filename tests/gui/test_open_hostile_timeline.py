"""File > Open, clicked in the window, on reports whose memory timeline or lost updates were
edited into shapes no AmpScope writes: each ends in the inline message naming the file and
the field (never "Opening report: showing…" left for good), and the run on show stays."""

from __future__ import annotations

import json

import pytest
from PySide6.QtWidgets import QFileDialog

from gui.main_window import MainWindow
from tests.engine.test_report_hostile_timeline import CASES, edit, profile_bf16
from tests.gui.clicks import menu_action

TIMEOUT_MS = 300_000


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return profile_bf16(tmp_path_factory.mktemp("timeline-gui"))[0]


def _open(qtbot, window, monkeypatch, path, signal):
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(path), "")))
    with qtbot.waitSignal(signal, timeout=TIMEOUT_MS):  # read off the GUI thread
        menu_action(window, "File", "Open report or journal…").trigger()


@pytest.mark.parametrize("case", ["no points", "no categories", "too many categories",
                                  "negative share", "lr of 0"])
def test_file_open_of_an_edited_report_says_why_inline(qtbot, monkeypatch, tmp_path, report,
                                                        case):
    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    _open(qtbot, window, monkeypatch, report, window.record_shown)
    shown = window.record
    key, change, fragment = CASES[case]
    data = json.loads(report.read_text())
    assert edit(data, key, change) >= 1
    bad = tmp_path / "edited.json"
    bad.write_text(json.dumps(data))
    _open(qtbot, window, monkeypatch, bad, window.open_failed)
    message = window.statusBar().currentMessage()
    assert message.startswith("Could not open the report:")
    assert str(bad) in message and fragment in message
    assert window.record is shown
