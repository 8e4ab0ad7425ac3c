"""Live charts of a run: loss, loss scale, step time, throughput, MFU, memory, monitor;
for a user's own loop also its learning rate, grad norm, where each step's time went
(data, forward, backward, optimizer, stacked) and the scalars it logged with ``rec.log``.

One ``PlotDataItem`` per curve, created the first time its series gets a point in a
run; points go into numpy ring buffers and a QTimer (15 Hz) hands only the curves that
changed to ``setData``, a few charts per tick in turn, and only while the charts are on
screen (a hidden tab catches up when it is shown). Painting is what costs here:
pyqtgraph regenerates an axis's ticks in Python whenever its range moves, and one axis
that changes width re-lays out all nine plots. So the x ranges move in pages rather
than at every point, the left axes have a fixed width, there is no grid (its lines
tripled the cost of a repaint), and the legend sits above the plots, where it cannot
cover a curve. A loaded report is replayed through the same point mapping
(``step_points``, ``monitor_points``) as a live run, in bulk.
"""

from __future__ import annotations

import functools
import html
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt, QTimer
from PySide6.QtGui import QTextOption
from PySide6.QtWidgets import QApplication, QFrame, QScrollArea, QVBoxLayout, QWidget

from engine.core.events import MonitorSample, ScalarLog, StepSample, TrialResult
from engine.record.columns import Columns
from engine.record.run_record import RunRecord
from gui.chart_specs import LIVE_CHARTS, MFU_TITLES, NAMED_TRIALS, USER_RUN_CHARTS, device_kind
from gui.palette import precision_color
from gui.plot_style import plain_axes  # also sets pyqtgraph's colours before any plot
from gui.ringbuffer import RingBuffer
from gui.trial_label_room import TrialLabelRoom

REDRAW_HZ = 15
MIN_CHART_PX = 300  # narrowest column: the grid has as many as the width allows (2 to 4)
# lowest plot area (the view box, inside title and axes): at 140 px the left axis shows four
# or five ticks apart and trial lines, bands and a note ("n/a: why") do not overprint; ten
# or eleven charts squeezed to fit a 1366 x 768 window had 32-64 px. Where the shown
# charts' rows need more than the tab's height, the charts scroll.
MIN_PLOT_PX = 140
MAX_COLUMNS = 4
CENTRED = Qt.AlignmentFlag.AlignHCenter
TITLE_LINE_PX = 17  # a 10 pt title line; titles wrap to their column's width
CHARTS_PER_TICK = 3  # a repaint costs about its area: each tick redraws a few changed charts
CAPACITY = 200_000  # points per curve; older ones scroll out
LEFT_AXIS_PX = 62  # fixed, so that new tick labels never re-lay out the whole grid
MONITOR_PAGE_S = 30.0  # first x page of the monitor charts; doubled when time runs past it
STEP_PAGE = 16  # first x page of the step charts when the run's length is not known

CHARTS = LIVE_CHARTS
HOST_TITLES = {
    "monitor_util": ("Host CPU", "CPU (%)", None),
    "monitor_memory": ("Host memory (process RSS)", "RSS (MiB)", None),
    "monitor_power": ("Host memory used", "used (MiB)", None),
}
MONITOR_CHARTS = ("monitor_util", "monitor_memory", "monitor_power", "monitor_gpm")
GPU_ONLY_CHARTS = ("memory", "monitor_gpm")
STEP_AXIS_LABEL = "step (□ = warm-up)"
MEASURED_SUFFIX = "vs measured peak"  # an MFU curve's name: "<precision> vs measured peak"
MIB = 2**20  # memory axes in MiB, the binary unit the tables and reports use
MONITOR_COLORS = ("#333333", "#0072B2", "#999999")
# GPM curve -> (MonitorSample field, colour): colour-blind-safe, distinct from the above
GPM_CURVES = {
    "tensor (any)": ("gpm_tensor_any_util_pct", "#333333"),
    "HMMA": ("gpm_tensor_hmma_util_pct", "#0072B2"),
    "IMMA": ("gpm_tensor_imma_util_pct", "#E69F00"),
    "SM active": ("gpm_sm_util_pct", "#009E73"),
    "DRAM bandwidth": ("gpm_dram_bw_util_pct", "#999999"),
}
# stacked time breakdown, bottom layer first: (StepSample field, name, colour)
BREAKDOWN = (("data_ms", "data", "#E69F00"), ("forward_ms", "forward", "#0072B2"),
             ("backward_ms", "backward", "#009E73"), ("optimizer_ms", "optimizer", "#CC79A7"),
             ("eval_ms", "evaluation", "#56B4E9"),  # evaluation and save: 0 in a step without
             ("save_ms", "checkpoint save", "#D55E00"))
# logged scalars take these in the order their names first appear
SCALAR_COLORS = ("#333333", "#D55E00", "#0072B2", "#009E73", "#CC79A7", "#E69F00", "#56B4E9")
# charts whose title names their curves in their colours (no precision legend applies)
TITLED_CHARTS = (*MONITOR_CHARTS, "step_breakdown", "scalars")
EMPTY_NOTES = {
    "scalars": "none logged: rec.log(eval_loss=...) charts any scalar at its step",
    "learning_rate": "n/a: no optimizer step was seen (Recorder without an optimizer)",
    "step_breakdown": "n/a: no training forward of the model was seen inside the steps",
}
# the HTML report draws warm-up steps as hollow markers on the curve: so do these charts
WARMUP_CHARTS = ("loss", "step_time", "throughput", "mfu", "memory")


def _mib(value: int | None) -> float | None:
    return None if value is None else value / MIB


@dataclass(frozen=True)
class Point:
    """One value for one curve: which chart, which curve, where, and how it is drawn."""

    chart: str
    name: str
    x: float
    y: float | None
    color: str
    dashed: bool = False
    scatter: str | None = None  # marker symbol for marker-only series
    legend: bool = False  # the precision's entry in the legend strip
    fill: bool = False  # a stacked layer: filled down to zero, lower layers drawn over it
    layer: int = 0  # stacking order of a filled layer (0 = bottom)


def step_points(s: StepSample) -> Iterator[Point]:
    """The points one training step adds to the step charts."""
    color = precision_color(s.precision).name()
    p, x = s.precision, float(s.step)
    scale = (math.log2(s.loss_scale)
             if s.loss_scale is not None and s.loss_scale > 0 else None)
    values = {
        "loss": s.loss,
        "loss_scale": scale,
        "step_time": s.step_ms / 1000.0,
        "throughput": s.tokens_per_s,
        "mfu": None if s.mfu is None else s.mfu * 100.0,
        "memory": _mib(s.allocated_bytes),
    }
    for chart, y in values.items():
        yield Point(chart, p, x, y, color, legend=chart == "loss")
        if s.warmup and chart in WARMUP_CHARTS:
            yield Point(chart, f"{p} warm-up", x, y, color, scatter="s")
    # the same model FLOPs over this machine's measured matmul peak: dashed
    measured = None if s.mfu_measured is None else s.mfu_measured * 100.0
    yield Point("mfu", f"{p} {MEASURED_SUFFIX}", x, measured, color, dashed=True)
    if s.warmup:
        yield Point("mfu", f"{p} {MEASURED_SUFFIX} warm-up", x, measured, color, scatter="s")
    if s.skipped and scale is not None:
        yield Point("loss_scale", f"{p} skipped", x, scale, color, scatter="o")
    yield Point("memory", f"{p} reserved", x, _mib(s.reserved_bytes), color, dashed=True)
    yield Point("learning_rate", p, x, s.learning_rate, color)
    yield Point("grad_norm", p, x, s.grad_norm, color)
    parts = [getattr(s, field) for field, _, _ in BREAKDOWN[:-2]] + [s.eval_ms or 0.0,
                                                                      s.save_ms or 0.0]
    if None not in parts:  # each layer's top is the sum of the layers up to it, in seconds
        top = 0.0
        for layer, ((_, name, layer_color), ms) in enumerate(zip(BREAKDOWN, parts)):
            top += ms / 1000.0
            yield Point("step_breakdown", name, x, top, layer_color, fill=True, layer=layer)


def scalar_points(log: ScalarLog, names: list[str]) -> Iterator[Point]:
    """The point a logged scalar adds; ``names``: the scalar names seen so far, in order
    (a new one is appended), which pick its colour."""
    if log.name not in names:
        names.append(log.name)
    color = SCALAR_COLORS[names.index(log.name) % len(SCALAR_COLORS)]
    yield Point("scalars", log.name, float(log.step), log.value, color)


# monitor curve -> (chart, MonitorSample field, colour, which polls: "any", "host" or
# "device"); byte fields are drawn in MiB. In the order a poll adds its points.
MONITOR_SERIES = (
    *(("monitor_gpm", name, field, color, "any") for name, (field, color) in GPM_CURVES.items()),
    ("monitor_util", "CPU %", "cpu_pct", MONITOR_COLORS[0], "host"),
    ("monitor_memory", "process RSS", "host_rss_bytes", MONITOR_COLORS[0], "host"),
    ("monitor_power", "host used", "host_mem_used_bytes", MONITOR_COLORS[0], "host"),
    ("monitor_util", "GPU %", "gpu_util_pct", MONITOR_COLORS[0], "device"),
    ("monitor_util", "memory bus %", "mem_util_pct", MONITOR_COLORS[1], "device"),
    ("monitor_memory", "device used", "gpu_mem_used_bytes", MONITOR_COLORS[0], "device"),
    ("monitor_memory", "this process", "process_mem_bytes", MONITOR_COLORS[1], "device"),
    ("monitor_power", "power", "power_w", MONITOR_COLORS[0], "device"),
)


def _polled_by(which: str, host: bool) -> bool:
    return which == "any" or (which == "host") == host


def monitor_points(m: MonitorSample, t0: float) -> Iterator[Point]:
    """The points one monitor sample adds, ``t0`` seconds being the run's start."""
    t = m.time_s - t0
    host = m.source == "host"
    for chart, name, field, color, which in MONITOR_SERIES:
        if _polled_by(which, host):
            value = getattr(m, field)
            yield Point(chart, name, t, _mib(value) if field.endswith("_bytes") else value,
                        color)


def _monitor_series(samples: Columns, t0: float) -> list[SeriesData]:
    """``monitor_points`` for a read journal's columns, a whole curve at a time (a long
    run has hundreds of thousands of polls); curves in the order their first point
    comes, as the per-poll path adds them."""
    x = samples.column("time_s") - t0
    texts = samples.texts()
    host = samples.column("source") == (texts.index("host") if "host" in texts else -2)
    found = []
    for order, (chart, name, field, color, which) in enumerate(MONITOR_SERIES):
        y = samples.column(field) / (MIB if field.endswith("_bytes") else 1)
        polled = host if which == "host" else ~host if which == "device" else True
        rows = np.flatnonzero(np.isfinite(y) & polled)
        if len(rows):
            first = Point(chart, name, float(x[rows[0]]), float(y[rows[0]]), color)
            found.append((rows[0], order, SeriesData(first, x[rows], y[rows])))
    return [series for _, _, series in sorted(found, key=lambda f: f[:2])]


def gpm_reasons(samples) -> list[str]:
    """The reasons GPM is n/a that the polls carry (one poll each, so a scan of one
    column for a read journal's columns)."""
    if isinstance(samples, Columns):
        return [samples[int(i)].gpm_reason for i in np.flatnonzero(
            samples.column("gpm_reason") >= 0)]
    return [m.gpm_reason for m in samples if m.gpm_reason]


@dataclass
class SeriesData:
    """A whole curve at once, for replaying a finished run (built off the GUI thread)."""

    style: Point  # chart, name, colour and style; its x and y are unused
    x: np.ndarray
    y: np.ndarray


def record_series(record: RunRecord, precisions: Iterable[str]) -> list[SeriesData]:
    """Every curve of a finished run as arrays: plain numpy, safe to build in any thread."""
    columns: dict[tuple[str, str], tuple[Point, list[float], list[float]]] = {}

    def add(points: Iterable[Point]) -> None:
        for point in points:
            if point.y is None or not math.isfinite(point.y):
                continue
            entry = columns.setdefault((point.chart, point.name), (point, [], []))
            entry[1].append(point.x)
            entry[2].append(point.y)

    for p in precisions:
        for step in record.steps(p):
            add(step_points(step))
    names: list[str] = []
    for log in record.scalars:
        add(scalar_points(log, names))
    t0 = record.started_s or (record.monitor_samples[0].time_s if record.monitor_samples else 0)
    if isinstance(record.monitor_samples, Columns):
        monitor = _monitor_series(record.monitor_samples, t0)
    else:
        for sample in record.monitor_samples:
            add(monitor_points(sample, t0))
        monitor = []
    return [SeriesData(style, np.asarray(xs), np.asarray(ys))
            for style, xs, ys in columns.values()] + monitor


class Log2Axis(pg.AxisItem):
    """Ticks of a log2-valued axis at whole powers of two only (2^16, never 2^16.2): a
    GradScaler's scale is always one."""

    MAX_TICKS = 6

    def tickValues(self, minVal, maxVal, size):
        low, high = math.ceil(min(minVal, maxVal)), math.floor(max(minVal, maxVal))
        if high < low:
            return []
        step = max(1, math.ceil((high - low + 1) / self.MAX_TICKS))
        return [(float(step), [float(v) for v in range(low, high + 1, step)])]

    def tickStrings(self, values, scale, spacing):
        return [f"2^{v:.0f}" for v in values]



@dataclass
class _Series:
    item: pg.PlotDataItem | pg.ScatterPlotItem
    color: str
    x: RingBuffer
    y: RingBuffer
    dirty: bool = False


class LiveCharts(QWidget):
    def __init__(self, parent: QWidget | None = None, capacity: int = CAPACITY) -> None:
        super().__init__(parent)
        self.capacity = capacity
        self.layout_widget = pg.GraphicsLayoutWidget()
        self.layout_widget.ci.setSpacing(0)  # tight gaps: more of each row is plot
        self.layout_widget.ci.setContentsMargins(0, 0, 0, 0)
        # the charts scroll under the verdict banner and beside the form, which stay put;
        # the columns follow the width, so there is never a sideways scroll bar
        self.scroll = QScrollArea()
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll.setWidget(self.layout_widget)
        QVBoxLayout(self).addWidget(self.scroll)
        self._view_width = 0  # set as the view is resized
        # precisions keep one colour everywhere, so one legend above the plots names them
        self.legend = pg.LegendItem(colCount=len(CHARTS), labelTextSize="9pt", frame=False)
        self.layout_widget.addItem(self.legend, row=0, col=0, colspan=3)
        self.columns = 3  # set by _arrange from the width
        self._refit = QTimer(self, singleShot=True, interval=0)  # the view's height, once
        self._refit.timeout.connect(self._fix_height)
        self.plots: dict[str, pg.PlotItem] = {}
        self.titles: dict[str, str] = {}  # chart -> title shown, without its curve key
        self._notes: dict[str, pg.TextItem] = {}
        for i, key in enumerate(CHARTS):
            axis = {"left": Log2Axis("left")} if key == "loss_scale" else {}
            plot = self.layout_widget.addPlot(row=1 + i // 3, col=i % 3, axisItems=axis)
            plot.setDownsampling(auto=True, mode="peak")
            plot.setClipToView(True)
            plot.getAxis("left").setWidth(LEFT_AXIS_PX)
            plot.getViewBox().setMinimumHeight(MIN_PLOT_PX)
            plain_axes(plot)
            plot.setLabel("bottom", "time since start" if key in MONITOR_CHARTS else
                          STEP_AXIS_LABEL, units="s" if key in MONITOR_CHARTS else None)
            self.plots[key] = plot
            self._notes[key] = self._make_note(plot.getViewBox())
            # pyqtgraph sizes a title to its text: here its column's width decides
            plot.titleLabel.updateMin = functools.partial(self._title_min, plot,
                                                          plot.titleLabel.updateMin)
        self._series: dict[tuple[str, str], _Series] = {}
        self._x_page: dict[str, float] = {}  # chart -> right end of its x range
        self._trial_lines: list[tuple[pg.PlotItem, pg.InfiniteLine]] = []
        self.label_room = TrialLabelRoom(self.plots[MONITOR_CHARTS[0]])  # the trial names
        self._reasons: dict[str, str] = {}  # chart -> why the engine gave no values
        self._steps_per_trial: int | None = None
        self._next_chart = 0  # where the next redraw tick starts its round
        self._t0: float | None = None
        self._host = False
        self._timer = QTimer(self)
        self._timer.setInterval(int(1000 / REDRAW_HZ))
        self._timer.timeout.connect(self._redraw_if_shown)
        self._timer.start()
        self.clear()
        self.set_source("profile")
        self.layout_widget.installEventFilter(self)  # new widths re-arrange the grid
        # the wheel over a chart scrolls the charts, as over any page that scrolls (it zoomed
        # the chart under the pointer instead); dragging still pans and right-drag zooms
        self.layout_widget.viewport().installEventFilter(self)

    @staticmethod
    def _make_note(view: pg.ViewBox) -> pg.TextItem:
        """A centred text over an empty chart ("n/a: why"), kept centred on resize."""
        note = pg.TextItem(color="#777777", anchor=(0.5, 0.5))
        note.setParentItem(view)  # in the view's pixel space, not data coordinates

        def place() -> None:
            note.setTextWidth(max(100.0, view.width() * 0.9))
            note.setPos(view.width() / 2, view.height() / 2)

        view.sigResized.connect(place)
        return note

    # --- series --------------------------------------------------------------------

    def _series_for(self, point: Point) -> _Series:
        key = (point.chart, point.name)
        series = self._series.get(key)
        if series is None:
            plot = self.plots[point.chart]
            if point.fill:  # lower layers in front: each shows down to the one below
                item = plot.plot(pen=pg.mkPen(point.color, width=1), fillLevel=0.0,
                                 brush=pg.mkBrush(point.color))
                item.setZValue(len(BREAKDOWN) - point.layer)
            elif point.scatter:
                item = pg.ScatterPlotItem(symbol=point.scatter, size=8,
                                          pen=pg.mkPen(point.color, width=1.5),
                                          brush=pg.mkBrush("w"))
                plot.addItem(item)
            else:
                style = Qt.PenStyle.DashLine if point.dashed else Qt.PenStyle.SolidLine
                item = plot.plot(pen=pg.mkPen(point.color, width=2, style=style))
            series = _Series(item, point.color, RingBuffer(self.capacity),
                             RingBuffer(self.capacity))
            self._series[key] = series
            if point.legend:
                # report text (a precision name) is shown as text, never as markup
                self.legend.addItem(item, html.escape(point.name))
                self._refit.start()  # a new row of names takes height from the charts
            if point.chart in TITLED_CHARTS:
                self._retitle(point.chart)
            elif point.chart == "mfu":
                self._retitle_mfu()
        return series

    def _retitle_mfu(self) -> None:
        """The MFU chart's title names the peak its curves divide by."""
        names = [name for chart, name in self._series if chart == "mfu"]
        measured = any(MEASURED_SUFFIX in n for n in names)
        datasheet = any(MEASURED_SUFFIX not in n for n in names)
        kind = "both" if measured and datasheet else "measured" if measured else "datasheet"
        self.titles["mfu"] = MFU_TITLES[kind]
        self.plots["mfu"].setTitle(html.escape(MFU_TITLES[kind]), size="10pt")

    def _add(self, point: Point) -> None:
        if point.y is None or not math.isfinite(point.y):
            return
        series = self._series_for(point)
        series.x.append(point.x)
        series.y.append(point.y)
        series.dirty = True
        self._notes[point.chart].setVisible(False)

    def add_step(self, s: StepSample) -> None:
        for point in step_points(s):
            self._add(point)

    def add_scalar(self, log: ScalarLog) -> None:
        for point in scalar_points(log, self._scalar_names):
            self._add(point)

    def add_monitor(self, m: MonitorSample) -> None:
        if self._t0 is None:
            self._t0 = m.time_s
        if m.source == "host":
            self._use_host_titles()
        for point in monitor_points(m, self._t0):
            self._add(point)
        if m.gpm_reason:
            self._note_gpm(m.gpm_reason)

    def _note_gpm(self, reason: str) -> None:
        """GPM n/a (CPU, before Hopper, not permitted): say why on its chart at once."""
        self._reasons.setdefault("monitor_gpm", reason)
        self._set_note("monitor_gpm", reason)

    def set_device_kind(self, kind: str | None) -> None:
        """A CPU run has no GPU charts: torch's CUDA allocator counters and NVML's GPM are
        hidden rather than shown as empty charts, and the monitor charts are the host's."""
        for key in GPU_ONLY_CHARTS:
            self.plots[key].setVisible(kind != "cpu")
        if kind == "cpu":
            self._use_host_titles()
        self._arrange()

    def set_source(self, source: str | None) -> None:
        """A user's own loop (any source but "profile") shows its lr, grad norm, time
        breakdown and logged scalars; a profile run has none of them, so no such charts."""
        for key in USER_RUN_CHARTS:
            self.plots[key].setVisible((source or "profile") != "profile")
        self._arrange()

    # --- layout ---------------------------------------------------------------------

    def visible_charts(self) -> list[str]:
        return [key for key, plot in self.plots.items() if plot.isVisible()]

    def _width(self) -> int:
        """The charts' width: the view's, once laid out (a new size reaches it after this
        widget's own resize event: ``eventFilter`` passes it on)."""
        return self._view_width or self.layout_widget.viewport().width() or self.width()

    def _arrange(self) -> None:
        """Place the shown charts only, in as many columns as the width holds (a hidden
        chart kept its cell, and three fixed columns ran off a 1366 px screen), with the
        titles wrapped to the column."""
        grid = self.layout_widget.ci.layout
        width = self._width()
        shown = self.visible_charts()
        columns = max(1, min(MAX_COLUMNS, width // MIN_CHART_PX, len(shown) or 1))
        placed = {grid.itemAt(i) for i in range(grid.count())}
        for plot in self.plots.values():
            if plot in placed:
                grid.removeItem(plot)
        for row in range(grid.rowCount()):  # rows left by more charts or fewer columns
            grid.setRowStretchFactor(row, 0)
        grid.removeItem(self.legend)
        grid.addItem(self.legend, 0, 0, 1, columns)
        for i, key in enumerate(shown):
            grid.addItem(self.plots[key], 1 + i // columns, i % columns)
            grid.setRowStretchFactor(1 + i // columns, 1)
        for column in range(MAX_COLUMNS):
            grid.setColumnStretchFactor(column, 1 if column < columns else 0)
            grid.setColumnPreferredWidth(column, 0)
        self.columns = columns
        self.legend.setColumnCount(max(1, width // 110))
        for key in shown:
            self._fit_title(self.plots[key])
            # pyqtgraph makes an axis 0 px wide when it is sized while its chart is hidden
            self.plots[key].getAxis("left").setWidth(LEFT_AXIS_PX)
        grid.invalidate()
        self._refit.start()

    def _fix_height(self) -> None:
        """The view as tall as its rows need with each plot area ``MIN_PLOT_PX`` high (a
        graphics view does not pass its scene's minimum size to the scroll area). Run once
        after titles re-wrap, the legend grows or the grid is re-arranged."""
        least = Qt.SizeHint.MinimumSize
        shown, columns = self.visible_charts(), self.columns
        rows = [shown[i:i + columns] for i in range(0, len(shown), columns)]
        height = self.legend.effectiveSizeHint(least).height() + sum(
            max(self.plots[key].effectiveSizeHint(least).height() for key in row)
            for row in rows)
        self.layout_widget.setMinimumHeight(math.ceil(height))

    def _fit_title(self, plot: pg.PlotItem) -> None:
        """Wrap a title (a monitor chart's names its curves) to its column's width."""
        width = self._width() / max(1, self.columns)
        label = plot.titleLabel
        # the title spans the plot's view box column: the left axis is beside it
        label.item.setTextWidth(max(80.0, width - LEFT_AXIS_PX - 16))
        if label.item.document().defaultTextOption().alignment() != CENTRED:
            label.item.document().setDefaultTextOption(QTextOption(CENTRED))
        label.updateMin()

    def _title_min(self, plot: pg.PlotItem, update_min) -> None:
        """After pyqtgraph sized the title to its text: as wide as the column allows, as tall
        as its lines (setTitle fixes its row at 30 px, one line and a half)."""
        update_min()
        label = plot.titleLabel
        height = max(TITLE_LINE_PX, label.item.boundingRect().height())
        label.setMinimumWidth(0)
        for hint in (Qt.SizeHint.MinimumSize, Qt.SizeHint.PreferredSize):
            label._sizeHint[hint] = (0, height)
        if label.isVisible():
            label.setMaximumHeight(height)
            plot.layout.setRowFixedHeight(0, height)
        label.updateGeometry()
        self._refit.start()  # a title of another height: the rows need another height

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 (Qt's name)
        if watched is self.layout_widget and event.type() == QEvent.Type.Resize:
            self._view_width = event.size().width()
            self._arrange()
        elif watched is self.layout_widget.viewport() and event.type() == QEvent.Type.Wheel:
            QApplication.sendEvent(self.scroll.verticalScrollBar(), event)
            return True
        return False

    def begin(self, time_s: float) -> None:
        """The run's start: monitor charts count seconds from here."""
        self._t0 = time_s

    def mark_trial_start(self, precision: str, time_s: float, named: bool = True) -> None:
        """A vertical line on the monitor charts where a trial began; ``named``: labelled
        with the precision (an interleaved precision's later rounds are not: their names
        overprinted the first ones on a short run)."""
        if self._t0 is None:
            self._t0 = time_s
        color = precision_color(precision)
        # the label is a format string to pyqtgraph: braces in a name are literal
        label = precision.replace("{", "{{").replace("}", "}}")
        # one chart names the trial (the others share its x axis): labels on all four
        # overprinted each other and the charts' n/a notes; gui.trial_label_room places them
        for key in MONITOR_CHARTS:
            labelled = named and key == MONITOR_CHARTS[0]
            line = pg.InfiniteLine(
                pos=time_s - self._t0, angle=90,
                pen=pg.mkPen(color, width=1, style=Qt.PenStyle.DotLine),
                label=label if labelled else None,
                labelOpts=self.label_room.label_opts(color),
            )
            self.plots[key].addItem(line)
            self._trial_lines.append((self.plots[key], line))
            if labelled:  # in a band above the curves, which never reach it
                self.label_room.add(line)

    def note_trial(self, trial: TrialResult) -> None:
        """Keep the engine's reason for a value it could not give, for charts left empty."""
        summary, memory = trial.summary, trial.memory
        if summary is not None and summary.mfu is None and summary.mfu_reason:
            self._reasons.setdefault("mfu", f"MFU n/a: {summary.mfu_reason}")
        if memory is not None and memory.peak_allocated_bytes is None:
            self._reasons.setdefault(
                "memory", "n/a: torch's allocator counters exist on CUDA only; memory by "
                          "category is in the Compare and Model tabs")

    def _set_note(self, chart: str, text: str) -> None:
        if any(key[0] == chart and len(s.x) for key, s in self._series.items()):
            return
        self._notes[chart].setHtml(f'<div style="text-align:center">{html.escape(text)}</div>')
        self._notes[chart].setVisible(True)

    def _use_host_titles(self) -> None:
        if self._host:
            return
        self._host = True
        for key, (title, label, units) in HOST_TITLES.items():
            self.titles[key] = title
            self._retitle(key)
            self.plots[key].setLabel("left", label, units=units)

    def _retitle(self, chart: str) -> None:
        """A monitor, breakdown or scalars chart's title names its curves in their colours
        (its legend)."""
        # a narrow column wraps the title between keys, never inside one
        keys = [f'<span style="color:{s.color}; white-space:nowrap">━ {html.escape(name)}</span>'
                for (c, name), s in self._series.items() if c == chart]
        title = html.escape(self.titles[chart])
        self.plots[chart].setTitle("  ".join([title, *keys]), size="10pt")

    # --- whole runs -------------------------------------------------------------------

    def clear(self, steps_per_trial: int | None = None) -> None:
        """Forget the shown run: curves, legend, markers, titles, axes and ranges."""
        for (chart, _), series in self._series.items():
            self.plots[chart].removeItem(series.item)
        self._series.clear()
        self.legend.clear()
        for plot, line in self._trial_lines:
            plot.removeItem(line)
        self._trial_lines.clear()
        self.label_room.clear()
        self._t0 = None
        self._host = False
        self._scalar_names: list[str] = []
        self._reasons.clear()
        self._steps_per_trial = steps_per_trial
        self._x_page.clear()
        for key, (title, label, units) in CHARTS.items():
            plot = self.plots[key]
            self.titles[key] = title
            plot.setTitle(html.escape(title), size="10pt")
            # a fresh axis: no SI prefix or range left over from the previous run's values
            plot.setLabel("left", label, units=units)
            plot.enableAutoRange(axis="y")
            plot.setYRange(0, 1, padding=0)
            plot.enableAutoRange(axis="y")
            self._page_x(key, 0.0)
        for chart in self._notes:
            self._set_note(chart, "no data yet")

    def show_series(self, record: RunRecord, series: list[SeriesData]) -> None:
        """Show a finished or loaded run from its ``record_series`` arrays."""
        config = record.config or {}
        self.clear(config.get("warmup", 0) + config.get("steps", 0) or None)
        self.set_device_kind(device_kind(record.environment))
        self.set_source(config.get("source"))
        self.begin(record.started_s)
        if any(s.style.name == "CPU %" for s in series):
            self._use_host_titles()
        for trial in record.trials:
            if trial.started_s:
                # more names than a short chart can stack overprint: the lines' colours
                # (the legend above) name them then
                self.mark_trial_start(trial.precision, trial.started_s,
                                      len(record.trials) <= NAMED_TRIALS)
        for data in series:
            curve = self._series_for(data.style)
            curve.x.extend(data.x)
            curve.y.extend(data.y)
            curve.dirty = True
            self._notes[data.style.chart].setVisible(False)
        for trial in record.trials:
            self.note_trial(trial)
        for reason in gpm_reasons(record.monitor_samples):
            self._note_gpm(reason)
        self.finish()

    def show_record(self, record: RunRecord, precisions: list[str]) -> None:
        """Replay a finished or loaded run through the live path's point mapping."""
        self.show_series(record, record_series(record, precisions))

    def finish(self) -> None:
        """Draw what is pending and mark charts the run left empty as n/a."""
        self.flush()
        for chart in CHARTS:
            self._set_note(chart, self._reasons.get(chart, EMPTY_NOTES.get(
                chart, "n/a: not reported for this run")))

    # --- drawing --------------------------------------------------------------------

    def _page_x(self, chart: str, x_last: float) -> None:
        """Move the x range only when a point passes its right end: by doubling it."""
        page = self._x_page.get(chart)
        if page is not None and x_last <= page:
            return
        if chart in MONITOR_CHARTS:
            page = MONITOR_PAGE_S
        else:
            page = (self._steps_per_trial - 1 if self._steps_per_trial else STEP_PAGE)
        page = max(page, 1.0)
        while page < x_last:
            page *= 2
        self._x_page[chart] = page
        # from 0, unless a full ring buffer has let the oldest points go
        x_first = min((s.x.view()[0] for (c, _), s in self._series.items()
                       if c == chart and len(s.x) == self.capacity), default=0.0)
        self.plots[chart].setXRange(x_first, page, padding=0.02)

    def _redraw_if_shown(self) -> None:
        # a hidden tab or a minimised window paints nothing: it catches up when shown
        if not self.isVisible() or self.window().isMinimized():
            return
        # a hidden chart (a profile run's grad norm) stays dirty: drawn once it is shown
        dirty = {chart for (chart, _), s in self._series.items()
                 if s.dirty and self.plots[chart].isVisible()}
        keys = list(CHARTS)
        drawn = 0
        for i in range(len(keys)):
            index = (self._next_chart + i) % len(keys)
            if keys[index] in dirty:
                self.flush(keys[index])
                drawn += 1
                self._next_chart = index + 1
                if drawn == CHARTS_PER_TICK:
                    break

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self.flush()

    def flush(self, only: str | None = None) -> None:
        """Hand the curves that changed (of one chart, or all) to pyqtgraph to repaint."""
        for (chart, _), series in self._series.items():
            if not series.dirty or (only is not None and chart != only):
                continue
            series.dirty = False
            x = series.x.view()
            series.item.setData(x, series.y.view())
            if len(x):
                self._page_x(chart, float(x[-1]))
                if chart == MONITOR_CHARTS[0]:
                    self.label_room.set_top(float(np.nanmax(series.y.view())), float(x[-1]))

    def curve_data(self, chart: str, name: str) -> tuple[np.ndarray, np.ndarray]:
        """The x and y the drawn curve was given (empty when it was never drawn)."""
        series = self._series.get((chart, name))
        if series is None or series.item.xData is None:
            return np.array([]), np.array([])
        return np.asarray(series.item.xData), np.asarray(series.item.yData)

    def curve_points(self, chart: str, name: str) -> int:
        """How many points the drawn curve was given (0 when it was never drawn)."""
        series = self._series.get((chart, name))
        if series is None:
            return 0
        if isinstance(series.item, pg.ScatterPlotItem):
            return len(series.item.data)
        return 0 if series.item.xData is None else len(series.item.xData)
