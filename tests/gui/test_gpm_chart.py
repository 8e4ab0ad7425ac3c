"""The GPM chart: hidden on the CPU (the reason kept), tensor-pipe and SM curves on Hopper."""

from __future__ import annotations

import pytest

from engine.core.events import MonitorSample
from engine.measure.gpm import NEEDS
from engine.record.run_record import RunRecord
from gui.live_charts import LiveCharts
from gui.main_window import MainWindow
from tests.gui.clicks import RUN_TIMEOUT_MS, choose, click, tick, type_into


def _note(charts: LiveCharts, chart: str) -> str | None:
    """The text over an empty chart, or None when no note is shown."""
    note = charts._notes[chart]
    return note.textItem.toPlainText() if note.isVisible() else None


def _hopper(t: float, tensor: float, sm: float) -> MonitorSample:
    return MonitorSample(time_s=t, source="nvml", gpu_util_pct=99.0,
                         gpm_tensor_any_util_pct=tensor, gpm_tensor_hmma_util_pct=tensor,
                         gpm_sm_util_pct=sm, gpm_dram_bw_util_pct=None)


@pytest.fixture
def window(qtbot):
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    qtbot.waitExposed(win)
    return win


def test_a_cpu_run_hides_the_gpm_chart_and_keeps_why(qtbot, window):
    panel = window.config_panel
    choose(panel.preset, "tiny")
    tick(panel.precisions, "fp32", True)
    for name in ("bf16-amp", "fp16-amp"):  # ticked by default beside fp32: one trial here
        tick(panel.precisions, name, False)
    for name, value in (("batch_size", "1"), ("seq_len", "16"), ("steps", "2"), ("warmup", "1")):
        type_into(getattr(panel, name), value)
    choose(panel.isolation, "inline")
    # choosing a device probes it again (the shared fill_form reads the form before that
    # answers): Run is clicked once it has
    choose(panel.device, "cpu")
    qtbot.waitUntil(lambda: not panel.device_pending(), timeout=RUN_TIMEOUT_MS)
    assert panel.config().precisions == ("fp32",) and panel.config().device == "cpu"
    seen = []
    window.worker.event.connect(  # after the window's own slot: what the chart shows by then
        lambda e: seen.append((e.gpm_reason,
                               window.charts.plots["monitor_gpm"].isVisible()))
        if isinstance(e, MonitorSample) and e.gpm_reason else None)
    with qtbot.waitSignal(window.record_shown, timeout=RUN_TIMEOUT_MS) as blocker:
        click(window.run_button)
    record = blocker.args[0]
    # the engine said why once (the report keeps it); a CPU run shows no GPU chart at all
    assert len(seen) == 1
    reason, visible = seen[0]
    assert reason.startswith(NEEDS) and "CPU" in reason
    assert not visible and not window.charts.plots["monitor_gpm"].isVisible()
    assert any(m.gpm_reason == reason for m in record.monitor_samples)
    assert window.charts.curve_points("monitor_gpm", "tensor (any)") == 0
    # a finished run replayed (as from history) hides it too; a GPU run shows it again
    window.charts.show_record(record, ["fp32"])
    assert not window.charts.plots["monitor_gpm"].isVisible()
    gpu = RunRecord(config={"steps": 2}, started_s=10.0, status="ok",
                    environment={"device": {"kind": "cuda"}})
    window.charts.show_record(gpu, [])
    assert window.charts.plots["monitor_gpm"].isVisible()


def test_gpm_samples_draw_curves_and_hide_the_note(qtbot):
    charts = LiveCharts()
    qtbot.addWidget(charts)
    charts.begin(100.0)
    values = [(100.0, 10.0, 40.0), (100.5, 62.5, 93.0), (101.0, 0.0, 5.0)]
    for t, tensor, sm in values:
        charts.add_monitor(_hopper(t, tensor, sm))
    charts.flush()
    assert _note(charts, "monitor_gpm") is None
    curve = charts._series[("monitor_gpm", "tensor (any)")].item
    assert list(curve.xData) == [t - 100.0 for t, _, _ in values]
    assert list(curve.yData) == [tensor for _, tensor, _ in values]
    assert list(charts._series[("monitor_gpm", "SM active")].item.yData) == [
        sm for _, _, sm in values]
    assert charts.curve_points("monitor_gpm", "HMMA") == 3
    # a metric the driver did not report is not drawn as 0
    assert charts.curve_points("monitor_gpm", "DRAM bandwidth") == 0
    assert charts.curve_points("monitor_gpm", "IMMA") == 0
    title = charts.plots["monitor_gpm"].titleLabel.text
    assert "Tensor pipe / SM activity (GPM)" in title and "SM active" in title
    charts.finish()
    assert _note(charts, "monitor_gpm") is None


def test_a_loaded_pre_hopper_run_shows_the_reason(qtbot):
    charts = LiveCharts()
    qtbot.addWidget(charts)
    reason = f"{NEEDS}: NVIDIA A100-SXM4-80GB is compute capability 8.0; GPM starts with Hopper"
    record = RunRecord(config={"steps": 2}, started_s=10.0, status="ok", monitor_samples=[
        MonitorSample(time_s=10.1, source="nvml", gpu_util_pct=80.0, gpm_reason=reason),
        MonitorSample(time_s=10.2, source="nvml", gpu_util_pct=85.0)])
    charts.show_record(record, [])
    assert _note(charts, "monitor_gpm") == reason
    assert charts.curve_points("monitor_util", "GPU %") == 2
