"""Charts after a real run (Run button, tiny preset, CPU): plain units, no SI prefix
rescaling, loss-scale ticks at whole powers of two only, and no GPU charts."""

from __future__ import annotations

import math

from engine.core.config import RunConfig
from gui.chart_specs import USER_RUN_CHARTS
from gui.main_window import MainWindow
from tests.gui.clicks import RUN_TIMEOUT_MS, click, click_tab, fill_form

RUN = RunConfig(model="tiny", precisions=("fp16-amp",), batch_size=1, seq_len=16, steps=3,
                warmup=1, device="cpu", isolation="inline")


# ticks for a chart this tall: the window here is not laid out at a screen's size (an axis
# of 0 px made pyqtgraph divide by zero)
TICK_PX = 200


def test_axes_use_plain_units_and_whole_powers_of_two(qtbot):
    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    fill_form(window, RUN)
    with qtbot.waitSignal(window.record_shown, timeout=RUN_TIMEOUT_MS) as blocker:
        click(window.run_button)
    record = blocker.args[0]
    charts = window.charts
    # a CPU run shows no GPU charts (CUDA allocator counters, NVML GPM), and a profile run
    # none of a user's loop (lr, grad norm, time split, logged scalars); the rest it shows
    assert record.environment["device"]["kind"] == "cpu"
    hidden = {k for k, p in charts.plots.items() if not p.isVisible()}
    assert hidden == {"memory", "monitor_gpm", *USER_RUN_CHARTS}
    click_tab(window.tabs, "Compare")
    plots = {**{f"live {k}": p for k, p in charts.plots.items()},
             **{f"compare {k}": p for k, p in window.compare_view.plots.items()}}
    for name, plot in plots.items():
        for side in ("left", "bottom"):
            axis = plot.getAxis(side)
            assert axis.autoSIPrefixScale == 1.0 and axis.labelUnitPrefix == "", (name, side)
            assert "(x" not in axis.labelString(), (name, side)
    # the host's used memory (thousands of MiB, where pyqtgraph wrote "(x0.001)") reads
    # in MiB as they are; the bytes come from the run's own samples
    used = [m.host_mem_used_bytes / 2**20 for m in record.monitor_samples
            if m.host_mem_used_bytes is not None]
    assert min(used) > 1000
    plot = charts.plots["monitor_power"]  # the host's used memory on a CPU run
    axis = plot.getAxis("left")
    low, high = plot.getViewBox().viewRange()[1]
    values = [v for _, vs in axis.tickValues(low, high, TICK_PX) for v in vs]
    assert max(values) > 1000
    # the GradScaler's scale is 2^16 throughout: ticks only at whole powers
    scale_plot = charts.plots["loss_scale"]
    axis = scale_plot.getAxis("left")
    low, high = scale_plot.getViewBox().viewRange()[1]
    ticks = [v for _, vs in axis.tickValues(low, high, TICK_PX) for v in vs]
    assert ticks and all(float(v).is_integer() for v in ticks)
    assert math.ceil(low) <= min(ticks) and max(ticks) <= math.floor(high)
    assert 16 in ticks or not (low <= 16 <= high)
    assert axis.tickStrings(ticks, 1, 1) == [f"2^{int(v)}" for v in ticks]
