"""Run pressed while the window still says "probing device…": the button says at once that
the run waits for the device, Stop cancels the wait, and the run starts when the probe
answers. The probe is held back until the test lets it answer, so "at once" is checked
right after the click, with no wall-clock wait."""

from __future__ import annotations

import threading

import pytest

from gui.main_window import MainWindow
from gui.pending_run import QUEUED, RUN, WAITING
from tests.gui.clicks import RUN_TIMEOUT_MS, choose, click, pause, type_into


@pytest.fixture
def held_probe(monkeypatch):
    """The window's device probe answers only once the event is set."""
    import engine.measure.device

    release = threading.Event()
    real_probe = engine.measure.device.probe

    def slow_probe(requested="auto"):
        if threading.current_thread().name == "ampscope-device-probe":
            release.wait(RUN_TIMEOUT_MS / 1000)  # the window's probe, not the run's
        return real_probe(requested)

    monkeypatch.setattr(engine.measure.device, "probe", slow_probe)
    yield release
    release.set()


def _window_before_the_probe_answers(qtbot) -> MainWindow:
    win = MainWindow()
    qtbot.addWidget(win)
    win.setVisible(True)  # show() waits for the probe in these tests (conftest)
    qtbot.waitExposed(win)
    panel = win.config_panel
    choose(panel.device, "cpu")
    choose(panel.preset, "tiny")
    type_into(panel.seq_len, "16")
    type_into(panel.steps, "2")
    type_into(panel.warmup, "0")
    assert panel.device_pending() and win.run_button.isEnabled()
    return win


def test_run_during_the_probe_says_it_waits_and_starts_when_the_probe_answers(qtbot,
                                                                             held_probe):
    win = _window_before_the_probe_answers(qtbot)
    click(win.run_button)
    # the click's answer is on screen as soon as it returns
    assert win.run_button.text() == WAITING and not win.run_button.isEnabled()
    assert win.statusBar().currentMessage() == QUEUED
    assert win.stop_button.isEnabled() and not win.worker.is_running()
    pause(50)  # other events (the form's checks) do not re-enable it meanwhile
    assert win.run_button.text() == WAITING and not win.run_button.isEnabled()
    with qtbot.waitSignal(win.record_shown, timeout=RUN_TIMEOUT_MS) as shown:
        held_probe.set()
    record = shown.args[0]
    assert record.environment["device"]["kind"] == "cpu"
    assert [t.precision for t in record.trials] and all(
        t.status in ("ok", "unsupported") for t in record.trials)
    assert win.run_button.text() == RUN and win.run_button.isEnabled()


def test_stop_cancels_a_run_waiting_for_the_device(qtbot, held_probe):
    win = _window_before_the_probe_answers(qtbot)
    click(win.run_button)
    click(win.stop_button)
    assert win.run_button.text() == RUN and win.run_button.isEnabled()
    assert not win.stop_button.isEnabled()
    assert win.statusBar().currentMessage() == "Queued run cancelled"
    with qtbot.waitSignal(win.config_panel.engine_loaded, timeout=RUN_TIMEOUT_MS):
        held_probe.set()
    pause(100)  # the probe's answer and the engine's load were handled: nothing started
    assert not win.worker.is_running() and win.record is None
