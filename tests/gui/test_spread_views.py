"""The window's interleave option and the speed verdict, used as a person would."""

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QFileDialog

from engine.core.events import StepSample, TrialResult, TrialSummary
from engine.record.run_record import RunRecord
from engine.record.spread import step_spread
from engine.report.json_io import write_json
from gui.main_window import MainWindow
from tests.gui.clicks import wait_for_device

RUN_TIMEOUT_MS = 300_000  # waits for a real run, does not time it
TOKENS = 1000


def _menu_action(win: MainWindow, menu: str, text: str):
    bar = win.menuBar()
    top = next(a for a in bar.actions() if a.text().replace("&", "") == menu)
    return next(a for a in top.menu().actions() if a.text().replace("&", "") == text)


def _click(widget):
    QTest.mouseClick(widget, Qt.MouseButton.LeftButton)


def test_interleave_checkbox_sets_the_runs_rounds(qtbot):
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    panel = win.config_panel
    assert panel.interleave.isChecked() and panel.config().interleave == "auto"
    _click(panel.interleave)
    assert not panel.interleave.isChecked() and panel.config().interleave == "off"
    _click(panel.interleave)
    assert panel.config().interleave == "auto"

    # a cheap run from the form: tiny model, 10 steps, two precisions -> two mirrored (ABBA) rounds
    panel.preset.setCurrentText("tiny")
    panel.device.setCurrentText("cpu")
    panel.isolation.setCurrentText("inline")
    wait_for_device(panel)  # Run is enabled once the probe has answered for "cpu"
    for box, value in ((panel.batch_size, 1), (panel.seq_len, 16), (panel.steps, 10),
                       (panel.warmup, 0)):
        box.setValue(value)
    for i in range(panel.precisions.count()):
        item = panel.precisions.item(i)
        wanted = item.text() in ("fp32", "bf16")
        item.setCheckState(Qt.CheckState.Checked if wanted else Qt.CheckState.Unchecked)
    with qtbot.waitSignal(win.record_shown, timeout=RUN_TIMEOUT_MS) as blocker:
        _menu_action(win, "Run", "Run").trigger()
    record = blocker.args[0]
    for trial in record.trials:
        # each round warms up one step: --warmup 0 still runs one (engine.core.config)
        assert [s.round for s in trial.steps] == [0] * 6 + [1] * 6
        assert [s.warmup for s in trial.steps].count(True) == 2
    assert win.run_progress.value() == win.run_progress.maximum()
    speed = win.compare_view.speed_note.text()
    assert speed.startswith("Speed: ")
    tsv = win.compare_view.table_tsv()
    assert "Speed-up 95% CI" in tsv.splitlines()[0]


def _trial(precision, step_times):
    steps = [StepSample(precision, i, False, 2.0, ms, TOKENS / (ms / 1e3), None, None, None,
                        None, None, False, 1.0, float(i)) for i, ms in enumerate(step_times)]
    median = float(np.median(step_times))
    summary = TrialSummary(len(steps), median, TOKENS / (median / 1e3), None, None, "cpu", None,
                           None, None, "n/a", 0, 2.0, None, spread=step_spread(steps, TOKENS))
    return TrialResult(precision, "ok", steps=steps, summary=summary)


def test_a_noisy_report_says_so_in_the_compare_view(qtbot, tmp_path, monkeypatch):
    swinging = [100.0 * (0.3, 1.7, 0.6, 1.4)[i % 4] for i in range(20)]
    steady = [120.0 * (1 + 0.004 * (i % 3)) for i in range(20)]
    record = RunRecord(run_id="noisy", config={"model": "tiny", "seed": 0},
                       trials=[_trial("fp32", steady), _trial("bf16-amp", swinging)],
                       status="ok", finished_s=1.0)
    path = write_json(record, tmp_path / "noisy.json")
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(path), ""))
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    with qtbot.waitSignal(win.record_shown, timeout=60_000):  # read off the GUI thread
        _menu_action(win, "File", "Open report or journal…").trigger()
    note = win.compare_view.speed_note
    # the swing widens the CI (issue #44: a wide CV ties, it does not silence the ranking)
    assert note.text().startswith("Speed: speed-ups not significant")
    assert "(CV above 10%): wide CIs" in note.text() and "idle machine" in note.text()
    rows = win.compare_view.table_tsv().splitlines()
    header = rows[0].split("\t")
    bf16 = dict(zip(header, next(r for r in rows if r.startswith("bf16-amp")).split("\t")))
    assert bf16["Speed-up verdict"] == "not significant"
    cv = np.std(swinging, ddof=1) / np.mean(swinging)
    assert bf16["Step CV"] == f"{cv * 100:.1f}%"
    p10, p90 = np.percentile(swinging, [10, 90])
    low, high = bf16["Step p10..p90"].removesuffix(" ms").split("..")
    assert (float(low), float(high)) == pytest.approx((p10, p90), rel=5e-3)  # 3 digits shown
    # each speed-up label sits above its whisker (a whisker once struck the label through)
    import pyqtgraph as pg

    plot = win.compare_view.plots["throughput"]
    label_y = {round(t.pos().x()): t.pos().y() for t in plot.items
               if isinstance(t, pg.TextItem) and t.toPlainText().endswith("vs fp32")}
    for x, trial in enumerate(record.trials):
        median_tokens = TOKENS / (np.median([s.step_ms for s in trial.steps]) / 1e3)
        ci_high = step_spread(trial.steps, TOKENS).tokens_per_s_ci[1]
        assert ci_high > median_tokens and label_y[x] >= ci_high  # above the bar and whisker
