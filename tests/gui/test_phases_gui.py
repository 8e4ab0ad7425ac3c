"""The trial table, the status bar and the progress bar say which phase each trial is in,
as a run started with the real Run button goes (tiny preset, CPU, interleaved rounds)."""

from __future__ import annotations

from PySide6.QtCore import QTimer

from engine.core.config import RunConfig
from engine.core.events import PhaseChanged, TrialStarted
from gui.main_window import MainWindow
from tests.gui.clicks import RUN_TIMEOUT_MS, click, fill_form

# 10 measured steps make "Interleave precisions" (auto) split them over 2 rounds of 5
RUN = RunConfig(model="tiny", precisions=("fp32", "bf16"), batch_size=1, seq_len=16,
                steps=10, warmup=1, device="cpu", isolation="inline")
SAID = {"loading": "loading model…", "probes": "counting FLOPs (untimed)", "warm-up": "warm-up",
        "measuring": "measuring",
        "memory step": "memory step (untimed)", "profiled step": "profiled step (untimed)",
        "between rounds": "between rounds"}


def test_each_phase_is_shown_as_it_happens(qtbot):
    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    fill_form(window, RUN)
    assert window.config_panel.interleave.isChecked()
    seen = []  # (event, its row's text, the other row's text, the status bar)

    def after_window(event) -> None:  # connected after the window's own slot
        if isinstance(event, PhaseChanged | TrialStarted):
            other = "bf16" if event.precision == "fp32" else "fp32"
            seen.append((event, window.trial_table.cell_text(event.precision, "Status"),
                         window.trial_table.cell_text(other, "Status"),
                         window.statusBar().currentMessage()))

    window.worker.event.connect(after_window)
    ticks = []  # what the window showed at each tick of a 10 ms timer

    def tick() -> None:
        ticks.append((window.statusBar().currentMessage(), window.run_progress.value(),
                      window.run_progress.maximum()))

    timer = QTimer()
    timer.timeout.connect(tick)
    timer.start(10)
    with qtbot.waitSignal(window.record_shown, timeout=RUN_TIMEOUT_MS) as blocker:
        click(window.run_button)
    timer.stop()
    record = blocker.args[0]
    assert [t.status for t in record.trials] == ["ok", "ok"]

    phases = [e for e, *_ in seen if isinstance(e, PhaseChanged)]
    # per precision: 5 phases in each round (the profiled step runs in the first round only,
    # the memory step in the last), 1 wait
    assert len(phases) == 2 * (5 + 5 + 1)
    for event, row, _, bar in seen:
        if isinstance(event, TrialStarted):
            expected = f"loading model… (round {event.round + 1}/2)"
        else:
            expected = f"{SAID[event.phase]} (round {event.round + 1}/2)"
        assert row == expected, (event, row)
        assert bar == f"{event.precision}: {expected}"
    # mirrored rounds (fp32, bf16, bf16, fp32): while bf16 runs both of its rounds, fp32
    # says it waits (not "running"); in fp32's second round bf16 has finished
    for event, _, other, _ in seen:
        if event.precision == "bf16":
            assert other == "between rounds (round 1/2)", (event, other)
        if event.precision == "fp32" and event.round == 1:
            assert other == "ok", (event, other)  # bf16 finished its last round
    # a second round's row says what it does, measuring included, not "loading model"
    assert ("fp32", "measuring (round 2/2)") in [
        (e.precision, row) for e, row, _, _ in seen if isinstance(e, PhaseChanged)]
    # progress never reads 100% while an untimed step still runs
    untimed = [(message, value, top) for message, value, top in ticks
               if "memory step" in message or "profiled step" in message]
    assert untimed and all(value < top for _, value, top in untimed), untimed
    assert window.run_progress.value() == window.run_progress.maximum()
    # every round's start is marked on the Host CPU chart, each precision named once
    cpu_plot = window.charts.plots["monitor_util"]
    lines = [line for plot, line in window.charts._trial_lines if plot is cpu_plot]
    assert len(lines) == 4
    labels = [getattr(line, "label", None) for line in lines]
    assert sorted(label.format for label in labels if label is not None) == ["bf16", "fp32"]
    for p in ("fp32", "bf16"):
        assert window.trial_table.cell_text(p, "Status") == "ok"
