"""A newcomer's CPU run at 1366 x 768, read chart by chart: the host CPU chart's trial names
sit in a band above the trace, and the Compare tab's memory across the step gives each
precision's plot a readable height with its peak in the title, over no other text."""

from __future__ import annotations

import re

import pyqtgraph as pg
import pytest
from PySide6.QtCore import QPointF

from engine.core.config import RunConfig
from gui.live_charts import MIN_PLOT_PX
from gui.main_window import MainWindow
from tests.gui.chart_room import assert_charts_readable
from tests.gui.clicks import RUN_TIMEOUT_MS, click, click_tab, fill_form, pause

READABLE_PX = 150  # a plot area this tall shows its axis ticks and bands apart


@pytest.fixture
def finished_run(qtbot):
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    win.resize(1366, 768)
    config = RunConfig(model="tiny", precisions=("fp32", "fp16-amp", "bf16-amp", "bf16"),
                       batch_size=2, seq_len=32, steps=4, warmup=1, device="cpu",
                       isolation="inline")
    fill_form(win, config)
    with qtbot.waitSignal(win.record_shown, timeout=RUN_TIMEOUT_MS) as shown:
        click(win.run_button)
    return win, shown.args[0]


def test_cpu_run_charts_are_legible_at_1366_by_768(qtbot, finished_run):
    win, record = finished_run
    click_tab(win.tabs, "Run")
    pause(300)
    _host_cpu_names_clear_of_the_trace(win, record)
    click_tab(win.tabs, "Compare")
    compare = win.compare_view
    sizes = compare.split.sizes()
    click_tab(compare.tables, "Memory across the step")
    pause(300)
    _memory_timeline_legible(compare.timeline, record)
    click_tab(compare.tables, "Comparison table")  # the bar charts get their room back
    assert compare.split.sizes() == sizes


def test_cpu_run_charts_keep_a_readable_plot_area(qtbot, finished_run):
    """A CPU run's eight charts at 1366 x 768: each plot area at least ``MIN_PLOT_PX`` high,
    reached with the scroll bar, the verdict and the Run button in view throughout."""
    win, _record = finished_run
    click_tab(win.tabs, "Run")
    pause(300)
    shown = assert_charts_readable(win)
    assert "memory" not in shown and "monitor_gpm" not in shown  # no GPU charts on a CPU
    assert win.verdict_banner.isVisible()
    for key in shown:  # each view box's own height, measured here too
        assert win.charts.plots[key].getViewBox().height() >= MIN_PLOT_PX, key


def _host_cpu_names_clear_of_the_trace(win, record) -> None:
    charts = win.charts
    plot = charts.plots["monitor_util"]
    box = plot.getViewBox()
    names = [line.label for line, _ in charts.label_room.labelled]
    assert sorted(n.textItem.toPlainText() for n in names) == sorted(
        t.precision for t in record.trials)
    # a name that would overprint another is left out (its line's colour is in the legend)
    names = [n for n in names if n.isVisible()]
    assert names and names[0].textItem.toPlainText() == record.trials[0].precision
    rects = [n.sceneBoundingRect() for n in names]
    inside = box.sceneBoundingRect()
    x, y = charts.curve_data("monitor_util", "CPU %")
    assert len(x) >= 2, "the host's CPU was sampled during the run"
    points = [box.mapViewToScene(QPointF(float(a), float(b))) for a, b in zip(x, y)]
    for i, rect in enumerate(rects):
        assert inside.contains(rect.adjusted(1, 1, -1, -1)), (rect, inside)
        for other in rects[i + 1:]:
            assert not rect.intersects(other), (rect, other)
        # the trace between its samples too: no sample above the band's bottom edge
        assert all(p.y() > rect.bottom() for p in points), (rect, min(p.y() for p in points))


def _memory_timeline_legible(timeline, record) -> None:
    assert [s.title for s in timeline.series] == [t.precision for t in record.trials]
    for plot, series in zip(timeline.plots, timeline.series, strict=True):
        box = plot.getViewBox()
        assert box.height() >= READABLE_PX, box.height()
        # the visible part of the plot, in the scroll area's viewport, is that tall too
        viewport = timeline.scroll.viewport()
        top = timeline.charts.mapTo(viewport, timeline.charts.mapFromScene(
            box.sceneBoundingRect().topLeft()))
        assert 0 <= top.y() and top.y() + READABLE_PX <= viewport.height(), (
            top.y(), viewport.height())
        title = plot.titleLabel.text
        peak = re.search(r"peak (\d+(\.\d+)?) (KiB|MiB|GiB)", title)
        assert peak, title
        # the peak the title gives is the stack's top, in the unit it names (2^10 steps)
        scale = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[peak.group(3)]
        stacked = max(sum(values[i] for values in series.values)
                      for i in range(len(series.x)))
        assert abs(float(peak.group(1)) * scale / stacked - 1) < 0.01, (title, stacked)
        title_rect = plot.titleLabel.sceneBoundingRect()
        for item in box.addedItems:
            if isinstance(item, pg.TextItem) and item.isVisible():
                assert not item.sceneBoundingRect().intersects(title_rect), \
                    item.textItem.toPlainText()
