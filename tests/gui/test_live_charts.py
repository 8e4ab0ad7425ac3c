"""Live charts take engine events as they come: curves, skipped-step markers, monitors."""

from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QLabel, QTabWidget

from engine.core.events import MonitorSample, StepSample
from gui.chart_specs import USER_RUN_CHARTS
from gui.live_charts import CHARTS, CHARTS_PER_TICK, LiveCharts


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
    assert charts.titles["monitor_util"] == "GPU utilisation"
    # the monitor charts name their curves in the title, not in a legend over the curves
    title = charts.plots["monitor_util"].titleLabel.text
    assert "GPU utilisation" in title and "GPU %" in title and "memory bus" not in title


def test_host_samples_retitle_the_monitor_charts(qtbot):
    charts = LiveCharts()
    qtbot.addWidget(charts)
    charts.add_monitor(MonitorSample(time_s=1.0, source="host", cpu_pct=30.0,
                                     host_rss_bytes=2**20))
    charts.flush()
    assert charts.titles["monitor_util"] == "Host CPU"
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


def _shown(qtbot, charts: LiveCharts) -> LiveCharts:
    charts.resize(1200, 700)
    charts.show()
    qtbot.waitExposed(charts)
    return charts


def _host(t: float, used_mib: float) -> MonitorSample:
    return MonitorSample(time_s=t, source="host", cpu_pct=40.0, host_rss_bytes=2**29,
                         host_mem_used_bytes=int(used_mib * 2**20))


def test_a_new_run_starts_with_fresh_legends_titles_and_axes(qtbot):
    """A host-monitored run, then a run that failed before any sample: nothing carries over."""
    charts = _shown(qtbot, LiveCharts())
    charts.begin(0.0)
    for t in range(5):
        charts.add_monitor(_host(float(t), 16_000.0))  # MiB: would read as "kW" on a W axis
    charts.add_step(_step(0, precision="fp32", scale=None))
    charts.finish()
    charts.grab()
    assert "host used" in charts.plots["monitor_power"].titleLabel.text
    assert len(charts.legend.items) == 1

    charts.clear(steps_per_trial=10)
    charts.finish()
    charts.grab()
    power = charts.plots["monitor_power"]
    assert power.titleLabel.text == "GPU power"
    assert charts.legend.items == []
    assert charts.curve_points("monitor_power", "host used") == 0
    assert power.getAxis("left").label.toPlainText().strip() == "power (W)"
    assert max(power.viewRange()[1]) <= 1.0  # no range left from the 16,000 MiB values

    charts.add_monitor(MonitorSample(time_s=1.0, source="nvml", power_w=120.0))
    charts.flush()
    charts.grab()
    assert power.getAxis("left").label.toPlainText().strip() == "power (W)"
    assert "━ power" in power.titleLabel.text


def test_warm_up_steps_get_hollow_markers_as_in_the_html_report(qtbot):
    charts = LiveCharts()
    qtbot.addWidget(charts)
    for i in range(5):
        s = _step(i, precision="bf16", scale=None, allocated=2**20)
        charts.add_step(StepSample(**{**s.__dict__, "warmup": i < 2}))
    charts.flush()
    for chart in ("loss", "step_time", "throughput", "memory"):
        assert charts.curve_points(chart, "bf16") == 5
        assert charts.curve_points(chart, "bf16 warm-up") == 2
    marker = charts._series[("loss", "bf16 warm-up")].item
    assert list(marker.data["x"]) == [0.0, 1.0]
    assert marker.opts["brush"].color().name() == "#ffffff"  # hollow
    assert "warm-up" in charts.plots["loss"].getAxis("bottom").label.toPlainText()


def test_the_legend_sits_outside_every_plot_and_shows_names_as_text(qtbot):
    charts = _shown(qtbot, LiveCharts())
    for p in ("fp32", "bf16-amp", "<b>odd</b>"):
        for i in range(20):
            charts.add_step(_step(i, precision=p, scale=None))
    charts.finish()
    charts.grab()
    legend = charts.legend.sceneBoundingRect()
    assert [label.text for _, label in charts.legend.items] == [
        "fp32", "bf16-amp", "&lt;b&gt;odd&lt;/b&gt;"]
    for key, plot in charts.plots.items():
        assert not legend.intersects(plot.getViewBox().sceneBoundingRect()), key


def test_step_charts_keep_their_x_range_while_steps_stream(qtbot):
    charts = _shown(qtbot, LiveCharts())
    charts.clear(steps_per_trial=40)
    ranges = []
    for i in range(40):
        charts.add_step(_step(i, precision="fp32", scale=None))
        charts.flush()
        ranges.append(tuple(charts.plots["step_time"].viewRange()[0]))
    assert len(set(ranges)) == 1  # the axis never had to be redrawn for a new x
    low, high = ranges[0]
    assert low <= 0 and 39 <= high < 41


def test_charts_on_a_hidden_tab_draw_nothing_until_the_tab_is_clicked(qtbot):
    tabs = QTabWidget()
    qtbot.addWidget(tabs)
    charts = LiveCharts()
    tabs.addTab(QLabel("other"), "Other")
    tabs.addTab(charts, "Charts")
    tabs.resize(1200, 700)
    tabs.show()
    qtbot.waitExposed(tabs)
    for i in range(10):
        charts.add_step(_step(i, precision="fp32", scale=None))
    qtbot.wait(400)  # several redraw ticks
    assert charts.curve_points("loss", "fp32") == 0
    bar = tabs.tabBar()
    QTest.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(1).center())
    assert tabs.currentWidget() is charts
    qtbot.waitUntil(lambda: charts.curve_points("loss", "fp32") == 10)


def test_each_redraw_tick_draws_a_few_changed_charts_in_turn(qtbot):
    charts = _shown(qtbot, LiveCharts())
    charts._timer.stop()  # ticks driven by hand below
    charts.add_step(_step(0, precision="fp32", scale=2.0**16, allocated=2**20))
    charts.add_monitor(_host(1.0, 100.0))
    # the step has no MFU, the host sample no GPM, a profile step no user-loop figures
    changed = [c for c in CHARTS if c not in ("mfu", "monitor_gpm", *USER_RUN_CHARTS)]
    drawn_after = []
    for _ in range(4):
        charts._redraw_if_shown()
        drawn_after.append({c for c in changed if any(
            charts.curve_points(c, name) for (chart, name) in charts._series if chart == c)})
    assert len(drawn_after[0]) == CHARTS_PER_TICK
    assert drawn_after[-1] == set(changed)
