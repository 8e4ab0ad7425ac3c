"""Whatever is on disk, the window opens, says what happened once, and loses nothing."""

from __future__ import annotations

import json
import os
import sqlite3

import pytest
from PySide6.QtWidgets import QFileDialog, QMessageBox

from engine.core.config import RunConfig, default_precisions
from engine.core.events import TrialResult
from engine.record.run_record import RunRecord
from gui import settings
from gui.history import HistoryStore, data_dir
from gui.main_window import MainWindow
from tests.gui.clicks import RUN_TIMEOUT_MS, click, fill_form

TINY = RunConfig(model="tiny", precisions=("fp32",), batch_size=1, seq_len=16, steps=2,
                 warmup=0, device="cpu", isolation="inline")


def _record(run_id: str, started: float) -> RunRecord:
    return RunRecord(run_id=run_id, config={"model": "tiny", "precisions": ["fp32"]},
                     trials=[TrialResult("fp32", "ok")], status="ok", started_s=started,
                     finished_s=started + 1)


def _db():
    return data_dir() / "history.sqlite3"


def _asides():
    return sorted(p.name for p in data_dir().glob("history.sqlite3.damaged-*"))


def _open(qtbot) -> MainWindow:
    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    return window


def _run(qtbot, window) -> RunRecord:
    fill_form(window, TINY)
    with qtbot.waitSignal(window.record_shown, timeout=RUN_TIMEOUT_MS) as blocker:
        click(window.run_button)
    return blocker.args[0]


def _good_store_with(*run_ids) -> None:
    store = HistoryStore()
    for i, run_id in enumerate(run_ids):
        store.add(_record(run_id, 1_700_000_000.0 + i))


# --- history database damaged before start ----------------------------------------


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_damaged_database_is_kept_aside_and_a_fresh_one_started(qtbot, damage):
    if damage == "garbage":
        _db().parent.mkdir(parents=True)
        _db().write_bytes(b"this is not a database\x00" * 100)
    else:
        _good_store_with(*(f"run{i}" for i in range(50)))
        data = _db().read_bytes()
        _db().write_bytes(data[: len(data) // 2])
    window = _open(qtbot)
    (aside,) = _asides()
    message = window.statusBar().currentMessage()
    assert str(_db()) in message and aside in message and "fresh one started" in message
    assert window.log.toPlainText().count(aside) == 1
    record = _run(qtbot, window)  # the fresh database works
    assert [e.id for e in window.history.list()] == [record.run_id]


def test_a_bad_row_moves_the_file_aside_and_keeps_the_good_runs(qtbot):
    _good_store_with("good1", "good2")
    with sqlite3.connect(_db()) as db:
        db.execute("INSERT INTO runs VALUES ('bad', 'yesterday', 'tiny', 'fp32', 'cpu', 'ok', "
                   "'{}')")
    window = _open(qtbot)
    assert len(_asides()) == 1
    assert "1 of its rows are damaged" in window.statusBar().currentMessage()
    assert "with the 2 runs that could be read" in window.statusBar().currentMessage()
    assert sorted(window.history_view.run_ids()) == ["good1", "good2"]


def test_a_stored_report_that_is_malformed_is_refused_when_opened(qtbot):
    _good_store_with("fine")
    report = _record("broken", 1_700_000_100.0).to_dict()
    report["trials"][0]["steps"] = [{"step": "one"}]
    with sqlite3.connect(_db()) as db:
        db.execute("INSERT INTO runs VALUES ('broken', 1700000100, 'tiny', 'fp32', 'cpu', 'ok', ?)",
                   (json.dumps(report),))
    window = _open(qtbot)
    shown = window.record
    assert window.history_view.open_run("broken") is None
    message = window.history_view.message.text()
    assert "run broken in the history" in message and "trials[0].steps[0]" in message
    assert window.record is shown and "trials[0].steps[0]" in window.statusBar().currentMessage()


def test_a_folder_that_cannot_be_created_gives_a_session_history(qtbot, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(blocker / "data"))
    window = _open(qtbot)
    message = window.statusBar().currentMessage()
    assert "cannot be used" in message and "this session only" in message
    record = _run(qtbot, window)
    assert [e.id for e in window.history.list()] == [record.run_id]


def test_a_database_locked_at_start_is_not_moved_aside(qtbot):
    _good_store_with("kept")
    other = sqlite3.connect(_db(), isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        window = _open(qtbot)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert _asides() == []
    message = window.statusBar().currentMessage()
    assert "another program holds it locked" in message and "this session only" in message
    assert [e.id for e in HistoryStore().list()] == ["kept"]


# --- history database that fails during the session ---------------------------------


def _answer_export(monkeypatch, path):
    asked = []

    def question(parent, title, text, *args):
        asked.append(text)
        return QMessageBox.StandardButton.Yes

    monkeypatch.setattr(QMessageBox, "question", staticmethod(question))
    monkeypatch.setattr(QFileDialog, "getSaveFileName",
                        staticmethod(lambda *a, **k: (str(path), "")))
    return asked


def test_a_database_deleted_mid_session_offers_to_export_the_run(qtbot, monkeypatch, tmp_path):
    window = _open(qtbot)
    os.remove(_db())
    asked = _answer_export(monkeypatch, tmp_path / "kept.json")
    record = _run(qtbot, window)
    # the report is written off the GUI thread
    qtbot.waitUntil(lambda: "Report written to" in window.statusBar().currentMessage(),
                    timeout=60_000)
    assert (tmp_path / "kept.json").exists()
    assert f"Run {record.run_id} was not saved" in window.log.toPlainText()
    assert "missing" in window.log.toPlainText()
    assert len(asked) == 1 and "Export it as a JSON report now?" in asked[0]
    assert not _db().exists()  # no stray empty database made behind the user's back


def test_a_locked_database_says_so_and_offers_export(qtbot, monkeypatch, tmp_path):
    window = _open(qtbot)
    asked = _answer_export(monkeypatch, tmp_path / "kept.json")
    other = sqlite3.connect(_db(), isolation_level=None)  # another program holds a write lock
    other.execute("BEGIN EXCLUSIVE")
    try:
        record = _run(qtbot, window)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert "another program holds it locked" in window.log.toPlainText()
    qtbot.waitUntil((tmp_path / "kept.json").exists, timeout=60_000)  # written in a thread
    assert len(asked) == 1
    assert record.run_id not in [e.id for e in window.history.list()]


def test_declining_the_export_still_leaves_the_message(qtbot, monkeypatch):
    window = _open(qtbot)
    os.remove(_db())
    monkeypatch.setattr(QMessageBox, "question",
                        staticmethod(lambda *a, **k: QMessageBox.StandardButton.No))
    record = _run(qtbot, window)
    assert window.statusBar().currentMessage().startswith(f"Run {record.run_id} was not saved")


# --- settings -------------------------------------------------------------------------


def test_bad_settings_fall_back_to_defaults_key_by_key(qtbot):
    store = settings.open_settings()
    store.setValue("config/last", json.dumps({
        "steps": 10**30, "batch_size": "lots", "seq_len": 48, "warmup": -3,
        "init_scale": float("inf"), "precisions": [{"x": 1}], "optimizer": "sgd",
        "grad_checkpointing": "yes", "device": 7, "growth_interval": 1.5}))
    store.setValue("window/geometry", "not a geometry")
    store.setValue("window/state", 12345)
    store.sync()
    window = _open(qtbot)
    values = window.config_panel.form_values()
    defaults = RunConfig()
    assert values["seq_len"] == 48 and values["optimizer"] == "sgd"  # the good keys
    assert values["steps"] == defaults.steps and values["batch_size"] == defaults.batch_size
    assert values["warmup"] == defaults.warmup
    assert values["init_scale"] == defaults.init_scale
    # no saved pick: the defaults for the device the probe found
    assert set(values["precisions"]) == set(default_precisions(window.config_panel.device_info))
    assert values["grad_checkpointing"] is False and values["device"] == "auto"
    assert values["growth_interval"] == defaults.growth_interval
    assert window.width() > 0 and window.isVisible()


def test_a_corrupt_window_state_opens_at_the_default_size(qtbot):
    from PySide6.QtCore import QByteArray

    store = settings.open_settings()
    store.setValue("window/geometry", QByteArray(b"\x01\xd9\xd0\xcb garbage" * 8))
    store.setValue("window/state", QByteArray(b"\xff" * 40))
    store.sync()
    window = _open(qtbot)
    free = window.screen().availableGeometry()
    assert (window.width(), window.height()) == (min(1400, free.width()),
                                                 min(900, free.height()))


def test_unreadable_settings_file_opens_with_defaults(qtbot, tmp_path):
    ini = tmp_path / "cfg" / "AmpScope" / "AmpScope.ini"
    ini.parent.mkdir(parents=True, exist_ok=True)
    ini.write_bytes(b"\x00\xff[config]\nlast=\"{\\\"steps\\\": [[[\"\n[window]\ngeometry=@Rect(")
    window = _open(qtbot)
    assert window.config_panel.form_values()["steps"] == RunConfig().steps
