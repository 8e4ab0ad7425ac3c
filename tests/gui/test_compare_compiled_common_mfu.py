"""The window's comparison says per trial whether it ran compiled, and its MFU chart divides
every recipe by the one common 16-bit peak, labelled: opened through File > Open from the
real H200 sweep and compiled bf16-amp reports, summarised as the engine summarises now."""

from __future__ import annotations

import dataclasses

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog

from engine.measure.peaks import common_peak
from engine.record.summary import summarise
from engine.report.json_io import write_json
from engine.run.timed_memory import timed_peak
from gui.chart_specs import MFU_TITLES
from gui.main_window import MainWindow
from tests.engine import h200
from tests.gui.clicks import RUN_TIMEOUT_MS


def _as_now(trial, compiled):
    memory, reason = timed_peak(trial.memory, compiled)
    summary = summarise(trial.steps, tokens_per_step=8 * 1024,
                        model_flops_per_step=trial.flops.analytic_per_step,
                        counted_flops_per_step=trial.flops.counted_per_step, peak=None,
                        memory=memory, memory_reason=reason,
                        common_peak=common_peak("NVIDIA H200"))
    return dataclasses.replace(trial, summary=summary, compiled=compiled)


def test_the_window_says_compiled_and_charts_the_common_mfu(qtbot, tmp_path, monkeypatch):
    sweep = h200.report(h200.SWEEP)
    compiled = h200.report("02-gpt2-bf16-amp.json").trials[0]
    trials = [_as_now(sweep.trial("fp32"), False),
              dataclasses.replace(_as_now(compiled, True), precision="bf16-amp")]
    path = write_json(dataclasses.replace(sweep, trials=trials), tmp_path / "h200.json")
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    qtbot.waitUntil(lambda: not win.config_panel.device_pending(), timeout=RUN_TIMEOUT_MS)
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(path), "")))
    file_menu = win.menuBar().actions()[0].menu()
    with qtbot.waitSignal(win.record_shown, timeout=RUN_TIMEOUT_MS):
        next(a for a in file_menu.actions() if a.text().startswith("&Open")).trigger()
    table = win.compare_view.table.model()
    headers = [table.headerData(c, Qt.Orientation.Horizontal) for c in range(table.columnCount())]
    column = headers.index("Compiled")
    cells = {table.index(r, 0).data(): table.index(r, column).data()
             for r in range(table.rowCount())}
    assert cells == {"fp32": "no", "bf16-amp": "yes"}
    peak = headers.index("Peak memory")
    shown = {table.index(r, 0).data(): table.index(r, peak).data()
             for r in range(table.rowCount())}
    assert shown["bf16-amp"] == "6.63 GiB"  # 7,124,083,712 B: the compiled steps' peak
    plot = win.compare_view.plots["mfu"]
    assert plot.titleLabel.text == MFU_TITLES["common"]
