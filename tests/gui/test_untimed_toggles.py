"""The window's form turns the optional untimed work off: the SQNR forward and the profiled
step, clicked off before Run (tiny preset, CPU, inline)."""

from __future__ import annotations

from engine.core.config import RunConfig
from gui.main_window import MainWindow
from tests.gui.clicks import RUN_TIMEOUT_MS, click, fill_form

RUN = RunConfig(model="tiny", precisions=("bf16-amp",), batch_size=1, seq_len=16, steps=2,
                warmup=1, device="cpu", isolation="inline")


def test_unticking_the_untimed_extras_skips_them(qtbot):
    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    fill_form(window, RUN)
    panel = window.config_panel
    assert panel.profile_step.isChecked() and panel.quant_error.isChecked()  # on by default
    click(panel.profile_step)
    click(panel.quant_error)
    with qtbot.waitSignal(window.record_shown, timeout=RUN_TIMEOUT_MS) as blocker:
        click(window.run_button)
    (trial,) = blocker.args[0].trials
    assert trial.status == "ok", trial.reason
    assert trial.quant_error is None and trial.quant_error_reason == (
        "turned off (--no-quant-error)")
    assert trial.profiled_step is None and "turned off" in trial.profiled_step_reason
    # what the form says is kept for the next start
    assert panel.saved_values()["quant_error"] is False
    assert panel.saved_values()["profile_step"] is False
