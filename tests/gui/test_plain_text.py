"""Text from a report is shown as the characters it holds, never rendered as HTML."""

from __future__ import annotations

import dataclasses

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QLabel, QMessageBox, QPushButton

from engine.report.json_io import write_json
from gui.main_window import MainWindow
from tests.engine.sample_record import make_record
from tests.gui.clicks import click, click_tree_item, menu_action

HOSTILE = '<img src="x.png"><h1>big{0}</h1>'
MARKUP = ("<img", "<h1>")


def _hostile_record():
    record = make_record()
    record.run_id = "run" + HOSTILE
    record.config["model"] = "model" + HOSTILE
    trials = []
    for trial in record.trials:
        changes = {"precision": trial.precision + HOSTILE, "footprint_note": HOSTILE}
        if trial.status != "ok":
            changes["reason"] = "reason" + HOSTILE
        if trial.dtype_map:
            changes["dtype_map"] = [dataclasses.replace(p, name=p.name + HOSTILE,
                                                        tied_to=HOSTILE)
                                    for p in trial.dtype_map]
            changes["module_tree"] = [dataclasses.replace(m, name=m.name + HOSTILE)
                                      for m in trial.module_tree]
        changes["steps"] = [dataclasses.replace(s, precision=s.precision + HOSTILE)
                            for s in trial.steps]
        trials.append(dataclasses.replace(trial, **changes))
    record.trials = trials
    return record


def _tooltips(window):
    tips = []
    for table in (window.trial_table,):
        for r in range(table.rowCount()):
            tips += [table.item(r, c).toolTip() for c in range(table.columnCount())
                     if table.item(r, c)]
    for model in (window.compare_view.proxy, window.model_view.params_proxy,
                  window.model_view.modules):
        for r in range(model.rowCount()):
            for c in range(model.columnCount()):
                tips.append(model.index(r, c).data(Qt.ItemDataRole.ToolTipRole) or "")
    return [t for t in tips if t]


def test_a_hostile_report_shows_its_text_as_text(qtbot, monkeypatch, tmp_path):
    path = write_json(_hostile_record(), tmp_path / "hostile.json")
    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(path), "")))
    with qtbot.waitSignal(window.record_shown, timeout=60_000):
        menu_action(window, "File", "Open report or journal…").trigger()

    # the text reached the views, as the characters it holds
    assert window.windowTitle() == f"AmpScope — run run{HOSTILE}"
    assert window.trial_table.cell_text(f"fp32{HOSTILE}", "Precision") == f"fp32{HOSTILE}"
    assert HOSTILE in window.model_view.summary.text()
    # labels that hold it are plain text; no rich-text label holds raw markup
    holding = 0
    for label in window.findChildren(QLabel):
        if any(m in label.text() for m in MARKUP):
            assert label.textFormat() == Qt.TextFormat.PlainText, label.text()
            holding += 1
    assert holding >= 1
    # tooltips are escaped HTML (Qt renders tooltips that look like HTML)
    tips = _tooltips(window)
    assert any("&lt;h1&gt;" in t for t in tips)
    assert not [t for t in tips if any(m in t for m in MARKUP)]
    # the live charts' legend strip holds HTML labels: escaped too
    legend_texts = [label.text for _, label in window.charts.legend.items]
    assert any("&lt;h1&gt;" in t for t in legend_texts)
    assert not [t for t in legend_texts if any(m in t for m in MARKUP)]


def test_history_delete_question_escapes_the_run_id(qtbot, monkeypatch):
    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    window.history.add(_hostile_record())
    window.history_view.refresh()
    asked = []
    monkeypatch.setattr(QMessageBox, "question", staticmethod(
        lambda parent, title, text, *a: asked.append(text) or QMessageBox.StandardButton.No))
    view = window.history_view
    window.tabs.setCurrentWidget(view)
    click_tree_item(view.tree, view.tree.topLevelItem(0))
    click(next(b for b in view.findChildren(QPushButton) if b.text() == "Delete"))
    assert asked and "&lt;h1&gt;" in asked[0] and "<h1>" not in asked[0]
