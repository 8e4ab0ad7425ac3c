"""A new user's first run: the default form compares fp32 with an autocast recipe this device
runs, and when the run ends, however it ends, the verdict is on the Run tab without a click;
"Details…" is the one click to the reasons."""

from __future__ import annotations

import pytest

from engine.core.config import RunConfig, default_precisions
from gui import settings
from gui.main_window import MainWindow
from tests.gui.clicks import RUN_TIMEOUT_MS, click, fill_form

ANSWERS = ("Train in ", "No recommendation: ")


@pytest.fixture
def window(qtbot):
    win = MainWindow()
    qtbot.addWidget(win)
    win.resize(1366, 768)
    win.show()  # returns once the device probe answered (conftest)
    qtbot.waitUntil(lambda: "numerics_view" in win._built, timeout=RUN_TIMEOUT_MS)
    return win


def _ended(window) -> bool:
    return not window.worker.is_running() and window.run_button.isEnabled()


def test_the_default_run_ends_with_its_verdict_on_the_run_tab(qtbot, window):
    panel = window.config_panel
    info = panel.device_info
    ticked = panel.checked_precisions()
    assert panel.form_values()["precisions"] == ticked
    assert set(ticked) == set(default_precisions(info))
    half = [p for p in ticked if p in ("bf16-amp", "fp16-amp")]
    assert "fp32" in ticked and half, ticked
    assert all(info.verdict(p).support == "native" for p in half)
    assert not window.verdict_banner.isVisible()  # no run yet, no verdict

    click(window.run_button)
    qtbot.waitUntil(lambda: _ended(window) and window.verdict_banner.isVisible(),
                    timeout=RUN_TIMEOUT_MS)

    assert window.tabs.currentWidget() is window.run_tab  # the user was not moved
    headline = window.verdict_banner.headline
    # every run that finished a trial answers (engine.record.verdict), busy or idle
    assert headline.isVisible() and headline.text().startswith("Train in "), headline.text()
    assert "Rules: " in window.verdict_banner.toolTip()  # the reasons, on hover
    assert f"Verdict: {headline.text().partition(':')[0]}" in window.statusBar().currentMessage()
    record = window.record
    assert [t.precision for t in record.trials] == ticked

    click(window.verdict_banner.details)  # the reasons, one click away
    assert window.tabs.currentWidget() is window.compare_view
    assert window.compare_view.verdict_label.text().startswith(headline.text())


def test_a_stopped_run_shows_its_verdict_too(qtbot, window):
    fill_form(window, RunConfig(model="tiny", precisions=("fp32", "fp16-amp"), batch_size=1,
                                seq_len=16, steps=100_000, warmup=0, device="cpu",
                                isolation="inline"))
    click(window.run_button)
    qtbot.waitUntil(lambda: window.trial_table.progress("fp32") >= 1, timeout=RUN_TIMEOUT_MS)
    click(window.stop_button)
    qtbot.waitUntil(lambda: _ended(window) and window.verdict_banner.isVisible(),
                    timeout=RUN_TIMEOUT_MS)
    assert window.record.status == "cancelled"
    assert window.verdict_banner.headline.text().startswith(ANSWERS)


def test_a_run_that_fails_shows_its_verdict_and_the_next_run_hides_it(qtbot, window):
    config = RunConfig(model="no-such-org/no-such-model", precisions=("fp32",), batch_size=1,
                       seq_len=16, steps=1, warmup=0, device="cpu", isolation="inline")
    with qtbot.waitSignal(window.record_shown, timeout=RUN_TIMEOUT_MS):
        assert window.start_run(config)
    assert window.record.status == "error"
    assert window.verdict_banner.isVisible()
    assert window.verdict_banner.headline.text().startswith("No recommendation: ")
    assert window.start_run(config.replace(model="tiny"))
    assert not window.verdict_banner.isVisible()  # the last run's verdict is not this one's
    qtbot.waitUntil(lambda: _ended(window), timeout=RUN_TIMEOUT_MS)


def test_a_saved_pick_of_precisions_stands_when_the_probe_answers(qtbot):
    settings.save_config_dict({"precisions": ["fp32"]})
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()  # returns once the device probe answered (conftest)
    assert not win.config_panel.device_pending()
    assert win.config_panel.checked_precisions() == ["fp32"]
