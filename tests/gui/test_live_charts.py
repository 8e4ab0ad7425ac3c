"""Live charts take engine events as they come: curves, skipped-step markers, monitors."""

from engine.events import MonitorSample, StepSample
from gui.live_charts import LiveCharts


def _step(i: int, precision="fp16-amp", scale=2.0**16, skipped=False, allocated=None):
    return StepSample(precision, i, False, 2.0, 10.0, 100.0, None, None, allocated,
                      None if allocated is None else 2 * allocated, scale, skipped, 1.0, float(i))


def test_skipped_steps_get_a_marker_on_the_log2_scale(qtbot):
    charts = LiveCharts()
    qtbot.addWidget(charts)
    charts.add_step(_step(0))
    charts.add_step(_step(1, scale=2.0**15, skipped=True))
    charts.flush()
    assert charts.curve_points("loss_scale", "fp16-amp") == 2
    assert charts.curve_points("loss_scale", "fp16-amp skipped") == 1
    curve = charts._series[("loss_scale", "fp16-amp")].item
    assert list(curve.yData) == [16.0, 15.0]


def test_nvml_samples_fill_the_gpu_charts(qtbot):
    charts = LiveCharts()
    qtbot.addWidget(charts)
    charts.begin(100.0)
    for t in range(3):
        charts.add_monitor(MonitorSample(time_s=100.0 + t, source="nvml", gpu_util_pct=50.0,
                                         mem_util_pct=None, gpu_mem_used_bytes=2**30,
                                         power_w=120.0))
    charts.flush()
    assert charts.curve_points("monitor_util", "GPU %") == 3
    assert charts.curve_points("monitor_util", "memory bus %") == 0  # None is not drawn as 0
    assert list(charts._series[("monitor_memory", "device used")].item.yData) == [1024.0] * 3
    assert list(charts._series[("monitor_power", "power")].item.xData) == [0.0, 1.0, 2.0]
    assert charts.plots["monitor_util"].titleLabel.text == "GPU utilisation"


def test_host_samples_retitle_the_monitor_charts(qtbot):
    charts = LiveCharts()
    qtbot.addWidget(charts)
    charts.add_monitor(MonitorSample(time_s=1.0, source="host", cpu_pct=30.0,
                                     host_rss_bytes=2**20))
    charts.flush()
    assert charts.plots["monitor_util"].titleLabel.text == "Host CPU"
    assert charts.curve_points("monitor_memory", "process RSS") == 1
    charts.clear()
    assert charts.plots["monitor_util"].titleLabel.text == "GPU utilisation"
    assert charts.curve_points("monitor_memory", "process RSS") == 0


def test_a_curve_keeps_its_newest_points_up_to_capacity(qtbot):
    charts = LiveCharts(capacity=1000)
    qtbot.addWidget(charts)
    item_before = None
    for i in range(2500):
        charts.add_step(_step(i, precision="fp32", scale=None, allocated=2**20))
        if i == 0:
            charts.flush()
            item_before = charts._series[("loss", "fp32")].item
    charts.flush()
    series = charts._series[("loss", "fp32")]
    assert series.item is item_before  # one PlotDataItem per curve, reused
    assert charts.curve_points("loss", "fp32") == 1000
    assert series.item.xData[0] == 1500 and series.item.xData[-1] == 2499
    assert charts.curve_points("memory", "fp32 reserved") == 1000
