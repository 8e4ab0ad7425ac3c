"""The trial table's Time column says how long each trial took on the run's critical path,
and its tooltip where the time went, phase by phase, after a run started with Run."""

from __future__ import annotations

from engine.core.config import RunConfig
from engine.core.events import TrialResult
from gui.main_window import MainWindow
from gui.trial_table import TrialTable
from tests.gui.clicks import RUN_TIMEOUT_MS, click, fill_form

RUN = RunConfig(model="tiny", precisions=("fp32", "bf16-amp"), batch_size=1, seq_len=16,
                steps=1, warmup=1, device="cpu", isolation="process")


def test_the_time_column_and_its_tooltip_show_each_trials_phases(qtbot):
    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    fill_form(window, RUN)
    click(window.config_panel.profile_step)  # the profiled steps off: a shorter run
    with qtbot.waitSignal(window.record_shown, timeout=RUN_TIMEOUT_MS) as blocker:
        click(window.run_button)
    record = blocker.args[0]
    table = window.trial_table
    for trial in record.trials:
        assert trial.status == "ok", trial.reason
        times = trial.phase_times
        # independent: every phase after the hand-over; the first trial's start-up counts too
        early = ("spawn", "imports", "waiting") if "waiting" in times else ()
        path = sum(s for phase, s in times.items() if phase not in early)
        assert table.cell_text(trial.precision, "Time") == f"{path:.1f} s"
        tip = table.item(table.precisions().index(trial.precision), 5).toolTip()
        for phase in ("spawn", "imports", "build", "probes", "warm-up", "measured",
                      "memory step", "teardown"):
            assert f"{phase}: {times[phase]:.2f} s" in tip, (phase, tip)
    # the second trial's process started during the first's untimed tail, and says so
    assert "ran beside the trial before" in table.item(1, 5).toolTip()


def test_a_trial_without_phase_times_says_why(qtbot):
    table = TrialTable()
    qtbot.addWidget(table)
    table.reset(["fp32"], 3)
    table.finish_trial(TrialResult("fp32", "ok"))
    assert table.cell_text("fp32", "Time") == "n/a"
    assert "from before they were recorded" in table.item(0, 5).toolTip()
