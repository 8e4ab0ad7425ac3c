"""Memory across one training step: a stacked area per precision, side by side.

Each precision's memory step (or a plan's traced step) as bytes by category over the
step's aten ops, from ``engine.record.memory_timeline_series`` (the series the HTML report
draws): one plot per precision, all on one byte axis (linked, the same range) so recipes
compare at a glance; the peak marked; the phases' starts as labelled lines, each
checkpointed layer's recompute shaded; the card's usable memory and, on a GPU, the
allocator's reserved peak and NVML's process memory as levels beside the stack. Hovering
names the category under the pointer, its bytes, the phase and the module.
"""

from __future__ import annotations

import bisect

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QScrollArea, QVBoxLayout, QWidget

from engine.record.memory_timeline_series import (
    CATEGORY_STYLE,
    TimelineSeries,
    plan_series,
    shared_top,
    size_text,
    trial_series,
)
from gui.palette import precision_color
from gui.plain_text import as_html, plain_label
from gui.plot_style import plain_axes  # also sets pyqtgraph's colours before any plot

MIB = 2**20
# the charts' least height (plots, axes and legend): below it they scroll rather than
# shrink, as they once did to about 50 px a plot at 1366 x 768
MIN_CHARTS_PX = 320
EMPTY_TEXT = ("No memory timeline: a trial records one in its memory step (reports from "
              "before it, user runs and stopped trials have none).")
_LEVEL_PENS = {"usable": ("#222222", Qt.PenStyle.SolidLine),
               "allocated": ("#997700", Qt.PenStyle.DashDotLine),
               "reserved": ("#994455", Qt.PenStyle.DashLine),
               "nvml": ("#004488", Qt.PenStyle.DotLine)}


def _steps(x: list[float], y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A value held from one point until the next: (x0,y0) (x1,y0) (x1,y1) ..."""
    xs = np.repeat(np.asarray(x, dtype=float), 2)[1:]
    ys = np.repeat(y, 2)[:-1]
    return xs, ys


class MemoryTimelineView(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.series: list[TimelineSeries] = []
        self.plots: list[pg.PlotItem] = []
        self.charts = pg.GraphicsLayoutWidget()
        self.charts.scene().sigMouseMoved.connect(self._hovered)
        self.note = plain_label(EMPTY_TEXT)
        self.hover_label = plain_label("Hover over a plot: the category, its bytes, the "
                                       "phase and the module.")
        self.hover_label.setObjectName("timelineHover")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.scroll = QScrollArea()
        self.scroll.setWidget(self.charts)
        self.scroll.setWidgetResizable(True)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.charts.setMinimumHeight(MIN_CHARTS_PX)
        layout.addWidget(self.note)
        layout.addWidget(self.scroll, 1)
        layout.addWidget(self.hover_label)

    def wanted_height(self) -> int:
        """The height that shows the charts whole, with the note and hover line."""
        spacing = self.layout().spacing()
        return (self.charts.minimumHeight() + 2 * self.scroll.frameWidth()
                + self.note.heightForWidth(max(self.width(), 400))
                + self.hover_label.sizeHint().height() + 2 * spacing)

    # --- filling ---------------------------------------------------------------------

    def show_record(self, record) -> None:
        drawn = [s for t in record.trials
                 if (s := trial_series(t, record.environment)) is not None]
        notes = sorted({s.note for s in drawn if s.note})
        self.show_series(drawn, "; ".join(notes))

    def show_plan(self, result) -> None:
        self.show_series([s for t in result.trials if (s := plan_series(t)) is not None], "")

    def show_series(self, drawn: list[TimelineSeries], note: str = "") -> None:
        self.charts.clear()
        self.series, self.plots = drawn, []
        if not drawn:
            self.note.setText(EMPTY_TEXT)
            return
        top = shared_top(drawn) / MIB * 1.08
        self.note.setText("Bytes by category across one training step, each point a real "
                          "moment (a few hundred kept, the peak exact); one byte axis for "
                          f"all.{'  ' + note if note else ''}")
        legend = pg.LegendItem(colCount=5, labelTextSize="8pt")
        for col, s in enumerate(drawn):
            plot = self.charts.addPlot(row=0, col=col)
            plot.disableAutoRange()  # one byte axis for all: set below, never re-fitted
            plain_axes(plot)
            # the peak in the title: as a label by its marker it ran under the title
            plot.setTitle(f"{s.title}: peak {size_text(s.peak_bytes)}",
                          color=precision_color(s.title.split(" ")[0]).name(), size="10pt")
            plot.setLabel("left", "memory", units="MiB")
            plot.setLabel("bottom", "aten ops into the step")
            plot.setMouseEnabled(x=False, y=False)
            plot.hideButtons()
            self._draw(plot, s, top, legend)
            plot.setYRange(0, top, padding=0)
            plot.setXRange(0, max(s.ops, 1), padding=0)
            if self.plots:
                plot.setYLink(self.plots[0])
            self.plots.append(plot)
        self.charts.addItem(legend, row=1, col=0, colspan=len(drawn))

    def _draw(self, plot: pg.PlotItem, s: TimelineSeries, top: float,
              legend: pg.LegendItem) -> None:
        named = {label.text for _, label in legend.items}

        def listed(sample, label: str) -> None:  # one legend for every plot
            if label not in named:
                legend.addItem(sample, label)
                named.add(label)

        base = np.zeros(len(s.x))
        below = pg.PlotDataItem(*_steps(s.x, base), pen=pg.mkPen((0, 0, 0, 0)))
        plot.addItem(below)
        for name, values in zip(s.categories, s.values, strict=True):
            label, color = CATEGORY_STYLE.get(name, (name, "#BBBBBB"))
            base = base + np.asarray(values, dtype=float) / MIB
            above = pg.PlotDataItem(*_steps(s.x, base), pen=pg.mkPen(color, width=1))
            plot.addItem(above)
            fill = pg.FillBetweenItem(below, above, brush=pg.mkBrush(color))
            fill.setZValue(-10)
            plot.addItem(fill)
            # a filled sample: a FillBetweenItem's own sample crashes the legend's paint
            listed(pg.PlotDataItem([], [], pen=pg.mkPen(color), fillLevel=0,
                                 fillBrush=pg.mkBrush(color)), label)
            below = above
        peak = pg.ScatterPlotItem([s.peak_x], [s.peak_bytes / MIB], symbol="t", size=10,
                                  brush=pg.mkBrush("k"), pen=None)
        plot.addItem(peak)
        listed(peak, "peak")
        if s.overlay_x:
            line = pg.PlotDataItem(
                *_steps(s.overlay_x, np.asarray(s.overlay_bytes, dtype=float) / MIB),
                pen=pg.mkPen("k", width=2))
            plot.addItem(line)
            listed(line, s.overlay_label)
        for level in s.levels:
            color, style = _LEVEL_PENS.get(level.key, ("#222222", Qt.PenStyle.SolidLine))
            plot.addItem(pg.InfiniteLine(
                pos=level.bytes / MIB, angle=0, pen=pg.mkPen(color, width=1.5, style=style),
                label=f"{level.label} {size_text(level.bytes)}",
                labelOpts={"position": 0.02, "color": color,
                           # below the line in the top half (above it, cut off by the top),
                           # above it in the bottom half (clear of the phases' labels)
                           "anchors": [(0, 0), (0, 1)]}))
        self._phases(plot, s)

    def _phases(self, plot: pg.PlotItem, s: TimelineSeries) -> None:
        width = max(s.ops, 1)
        for first, last, phase in s.spans:
            if phase.startswith("recompute"):
                region = pg.LinearRegionItem((first, last), movable=False,
                                             brush=pg.mkBrush(QColor(150, 150, 150, 70)),
                                             pen=pg.mkPen(None))
                region.setZValue(-20)
                plot.addItem(region)
            else:
                plot.addItem(pg.InfiniteLine(pos=first, angle=90,
                                             pen=pg.mkPen("#555555", width=1)))
            if (last - first) / width >= 0.07:  # along the bottom: the peak's label is above
                short = "recompute" if phase.startswith("recompute") else phase
                label = pg.TextItem(short, color="#222222", anchor=(0.5, 1))
                label.setPos((first + last) / 2, 0)
                plot.addItem(label)

    # --- hover -----------------------------------------------------------------------

    def describe(self, plot_index: int, x: float, y_mib: float) -> str | None:
        """What lies under the pointer at (x, y) of one plot: the category whose band holds
        ``y`` at the moment ``x`` (the last point at or before it), or None above the stack."""
        s = self.series[plot_index]
        index = bisect.bisect_right(s.x, x) - 1
        if index < 0 or y_mib < 0:
            return None
        top = 0.0
        for name, values in zip(s.categories, s.values, strict=True):
            top += values[index] / MIB
            if y_mib <= top:
                return s.hover(index, name)
        return None

    def _hovered(self, pos: QPointF) -> None:
        for i, plot in enumerate(self.plots):
            if not plot.sceneBoundingRect().contains(pos):
                continue
            point = plot.vb.mapSceneToView(pos)
            text = self.describe(i, point.x(), point.y())
            if text is not None:
                self.hover_label.setText(text.replace("\n", "; "))
                self.charts.setToolTip(as_html(text))  # Qt shows it where the pointer rests
            return

    def scene_point(self, plot_index: int, x: float, y_mib: float) -> QPoint:
        """Where (x, y) of a plot lies in the chart widget's viewport (for tests and tours)."""
        scene = self.plots[plot_index].vb.mapViewToScene(QPointF(x, y_mib))
        return self.charts.mapFromScene(scene)
