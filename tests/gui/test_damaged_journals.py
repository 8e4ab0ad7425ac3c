"""Whatever journals lie in runs/, the window starts, History lists each damaged one as
damaged (naming the file and the field), opening one refuses it and keeps the run on show,
and Delete removes a run's journal with its database row."""

from __future__ import annotations

import json
import os
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QMessageBox

from engine.core.config import RunConfig
from engine.run.runner import Runner
from gui.history import HistoryStore
from gui.main_window import MainWindow
from tests.gui.clicks import click, double_click, pause

HEADER = {"e": "journal", "version": 1, "pid": 1}
# the reproduction first, then the other damaged run lines it lists
DAMAGED = {
    "text_time": ({"e": "run", "run_id": "x", "config": {}, "environment": {}, "time_s": "x"},
                  "time_s"),
    "config_list": ({"e": "run", "run_id": "y", "config": [], "environment": {},
                     "time_s": 1.0}, "config"),
    "int_precisions": ({"e": "run", "run_id": "z", "config": {"precisions": 3},
                        "environment": {}, "time_s": 1.0}, "config.precisions"),
    "huge_precision": ({"e": "run", "run_id": "w", "config": {"precisions": ["p" * 1_000_000]},
                        "environment": {}, "time_s": 1.0}, "config.precisions[0]"),
}


def _runs() -> Path:
    return Path(os.environ["AMPSCOPE_DATA_DIR"]) / "runs"


def _write_damaged() -> None:
    _runs().mkdir(parents=True, exist_ok=True)
    for name, (run, _) in DAMAGED.items():
        (_runs() / f"{name}.jsonl").write_text(json.dumps(HEADER) + "\n" + json.dumps(run) + "\n")
    deep: dict = {}
    for _ in range(5000):  # deeper than the JSON reader recurses
        deep = {"a": deep}
    (_runs() / "deep.jsonl").write_text(
        json.dumps(HEADER) + "\n" + '{"e":"run","environment":' + '{"a":' * 5000 + "{}"
        + "}" * 5000 + "}\n")


def _item(view, run_id):
    return view.tree.topLevelItem(view.run_ids().index(run_id))


def _double_click(view, run_id) -> None:
    item = _item(view, run_id)
    view.tree.scrollToItem(item)
    pause(50)  # the tab's layout settles before the click lands on the row
    assert view.tree.itemAt(view.tree.visualItemRect(item).center()) is item
    pos = view.tree.visualItemRect(item).center()
    double_click(view.tree.viewport(), pos)


def test_the_window_starts_on_damaged_journals_and_lists_them(qtbot):
    good = Runner(RunConfig(model="tiny", precisions=("fp32",), batch_size=1, seq_len=16,
                            steps=2, warmup=0, device="cpu", isolation="inline")).run()
    _write_damaged()
    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    window.tabs.setCurrentWidget(window.history_view)
    view = window.history_view
    for name, (_, field) in DAMAGED.items():
        item = _item(view, name)
        assert item.text(5) == "damaged"
        tip = item.toolTip(0)
        assert str(_runs() / f"{name}.jsonl") in tip and field in tip and "line 2" in tip
        assert len(tip) < 2000
    assert _item(view, "deep").text(5) == "damaged"
    # the good run opens; a damaged one is refused by name and the good run stays on show
    with qtbot.waitSignal(window.record_shown, timeout=60_000):
        _double_click(view, good.run_id)
    assert window.record.run_id == good.run_id
    _double_click(view, "text_time")
    qtbot.waitUntil(lambda: "time_s" in view.message.text())
    assert str(_runs() / "text_time.jsonl") in view.message.text()
    assert window.record.run_id == good.run_id


def test_delete_removes_the_journal_with_the_database_row(qtbot, monkeypatch):
    runner = Runner(RunConfig(model="tiny", precisions=("fp32",), batch_size=1, seq_len=16,
                              steps=2, warmup=0, device="cpu", isolation="inline"))
    record = runner.run()
    store = HistoryStore()
    store.add(record)  # as the window keeps a run it made: a row and its journal
    assert runner.journal_path.exists()
    window = MainWindow(history=store)
    qtbot.addWidget(window)
    window.show()
    window.tabs.setCurrentWidget(window.history_view)
    view = window.history_view
    item = _item(view, record.run_id)
    QTest.mouseClick(view.tree.viewport(), Qt.MouseButton.LeftButton,
                     pos=view.tree.visualItemRect(item).center())
    monkeypatch.setattr(QMessageBox, "question",
                        staticmethod(lambda *a, **k: QMessageBox.StandardButton.Yes))
    delete = next(b for b in view.findChildren(type(window.run_button))
                  if b.text() == "Delete")
    click(delete)
    assert record.run_id not in view.run_ids()
    assert not runner.journal_path.exists()
    view.refresh()  # the run does not come back from its journal
    assert record.run_id not in view.run_ids()


def _report_with(tmp_path, record, name, damage) -> Path:
    from engine.report.json_io import write_json

    path = write_json(record, tmp_path / f"{name}.json")
    data = json.loads(path.read_text())
    damage(data)
    path.write_text(json.dumps(data))
    return path


def _set_step_ms(data):
    data["trials"][0]["steps"][0]["step_ms"] = 1e308


def _set_depth(data):
    data["trials"][0]["module_tree"][0]["depth"] = -3


def _set_precision(data):
    data["trials"][0]["precision"] = "p" * 1_000_000


def test_absurd_reports_are_refused_and_the_run_on_show_stays(qtbot, monkeypatch, tmp_path):
    from PySide6.QtWidgets import QFileDialog

    from tests.gui.clicks import menu_action

    record = Runner(RunConfig(model="tiny", precisions=("fp32",), batch_size=1, seq_len=16,
                              steps=2, warmup=0, device="cpu", isolation="inline")).run()
    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    good = _report_with(tmp_path, record, "good", lambda data: None)
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(good), "")))
    with qtbot.waitSignal(window.record_shown, timeout=60_000):
        menu_action(window, "File", "Open report or journal…").trigger()
    cases = {"huge_step": (_set_step_ms, "step_ms"), "negative_depth": (_set_depth, "depth"),
             "long_precision": (_set_precision, "precision")}
    for name, (damage, field) in cases.items():
        path = _report_with(tmp_path, record, name, damage)
        monkeypatch.setattr(QFileDialog, "getOpenFileName",
                            staticmethod(lambda *a, p=path, **k: (str(p), "")))
        with qtbot.waitSignal(window.open_failed, timeout=60_000) as failed:
            menu_action(window, "File", "Open report or journal…").trigger()
        message = str(failed.args[0])
        assert str(path) in message and field in message and len(message) < 2000
        assert window.record.run_id == record.run_id  # still on show
        assert "showing" not in window.statusBar().currentMessage().lower()


def test_watching_a_damaged_journal_stops_and_says_where(qtbot, monkeypatch, tmp_path):
    from PySide6.QtWidgets import QFileDialog

    from tests.gui.clicks import menu_action

    runner = Runner(RunConfig(model="tiny", precisions=("fp32",), batch_size=1, seq_len=16,
                              steps=2, warmup=0, device="cpu", isolation="inline"))
    runner.run()
    lines = [json.loads(x) for x in runner.journal_path.read_text().splitlines()]
    step = next(i for i, line in enumerate(lines) if line["e"] == "step")
    lines[step]["step_ms"] = 1e308
    del lines[step + 1:]  # the writer never ended it: without the check, Watching... forever
    path = tmp_path / "damaged.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(path), "")))
    menu_action(window, "File", "Watch run…").trigger()
    qtbot.waitUntil(lambda: "Stopped watching" in window.statusBar().currentMessage(),
                    timeout=60_000)
    message = window.statusBar().currentMessage()
    assert f"line {step + 1}" in message and "step_ms" in message
