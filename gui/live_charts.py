"""Live charts of a run: loss, loss scale, step time, throughput, MFU, memory, monitor.

One ``PlotDataItem`` per curve, created the first time its series gets a point and
reused for the rest of the window's life; points go into numpy ring buffers and a
QTimer (~15 Hz) hands only the curves that changed to ``setData``. Downsampling and
clip-to-view keep a 100,000-point curve cheap to redraw. A loaded report is replayed
through the same ``add_step`` / ``add_monitor`` calls as a live run.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QVBoxLayout, QWidget

from engine.events import MonitorSample, StepSample, TrialResult
from engine.record import RunRecord
from gui import plot_style  # noqa: F401 (sets pyqtgraph's colours before any plot)
from gui.palette import precision_color
from gui.ringbuffer import RingBuffer

REDRAW_HZ = 15
CAPACITY = 200_000  # points per curve; older ones scroll out

# chart key -> (title, left-axis label, units pyqtgraph may prefix: only for s and W)
CHARTS: dict[str, tuple[str, str, str | None]] = {
    "loss": ("Loss", "loss", None),
    "loss_scale": ("Loss scale (○ = skipped step)", "log2(scale)", None),
    "step_time": ("Step time", "step time", "s"),
    "throughput": ("Throughput", "tokens/s", None),
    "mfu": ("MFU (model FLOPs, no recompute)", "MFU (%)", None),
    "memory": ("Allocated (solid) / reserved (dashed)", "memory (MiB)", None),
    "monitor_util": ("GPU utilisation", "utilisation (%)", None),
    "monitor_memory": ("GPU memory", "memory (MiB)", None),
    "monitor_power": ("GPU power", "power", "W"),
}
HOST_TITLES = {
    "monitor_util": ("Host CPU", "CPU (%)", None),
    "monitor_memory": ("Host memory (process RSS)", "RSS (MiB)", None),
    "monitor_power": ("Host memory used", "used (MiB)", None),
}
MIB = 2**20  # memory axes in MiB, the binary unit the tables and reports use
MONITOR_COLORS = ("#333333", "#0072B2", "#999999")
LEGEND_CHARTS = ("loss", "monitor_util", "monitor_memory", "monitor_power")


def _mib(value: int | None) -> float | None:
    return None if value is None else value / MIB


class Log2Axis(pg.AxisItem):
    """Ticks of a log2-valued axis written as powers of two (2^16 rather than 16)."""

    def tickStrings(self, values, scale, spacing):
        return [f"2^{v:g}" for v in values]


@dataclass
class _Series:
    item: pg.PlotDataItem | pg.ScatterPlotItem
    x: RingBuffer
    y: RingBuffer
    dirty: bool = False


class LiveCharts(QWidget):
    def __init__(self, parent: QWidget | None = None, capacity: int = CAPACITY) -> None:
        super().__init__(parent)
        self.capacity = capacity
        self.layout_widget = pg.GraphicsLayoutWidget()
        QVBoxLayout(self).addWidget(self.layout_widget)
        self.plots: dict[str, pg.PlotItem] = {}
        self._notes: dict[str, pg.TextItem] = {}
        for i, (key, (title, label, units)) in enumerate(CHARTS.items()):
            axis = {"left": Log2Axis("left")} if key == "loss_scale" else {}
            plot = self.layout_widget.addPlot(row=i // 3, col=i % 3, axisItems=axis)
            # precisions keep one colour everywhere, so one legend for them is enough;
            # monitor curves rise from the left, so their legend sits bottom right
            offset = None if key not in LEGEND_CHARTS else (
                (-5, -5) if key.startswith("monitor") else (-5, 5))
            self._style(plot, title, label, units, offset)
            plot.setLabel("bottom", "time since start" if key.startswith("monitor") else "step",
                          units="s" if key.startswith("monitor") else None)
            self.plots[key] = plot
            self._notes[key] = self._make_note(plot.getViewBox())
        self._series: dict[tuple[str, str], _Series] = {}
        self._trial_lines: list[tuple[pg.PlotItem, pg.InfiniteLine]] = []
        self._reasons: dict[str, str] = {}  # chart -> why the engine gave no values
        self._t0: float | None = None
        self._host = False
        self._timer = QTimer(self)
        self._timer.setInterval(int(1000 / REDRAW_HZ))
        self._timer.timeout.connect(self.flush)
        self._timer.start()
        self.clear()

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

    @staticmethod
    def _style(plot: pg.PlotItem, title: str, label: str, units: str | None,
               legend_offset: tuple[int, int] | None) -> None:
        plot.setTitle(title, size="10pt")
        plot.setLabel("left", label, units=units)
        plot.showGrid(x=True, y=True, alpha=0.25)
        plot.setDownsampling(auto=True, mode="peak")
        plot.setClipToView(True)
        if legend_offset is not None:
            plot.addLegend(offset=legend_offset, labelTextSize="8pt",
                           brush=pg.mkBrush(255, 255, 255, 220), pen=pg.mkPen("#CCCCCC"))

    # --- series --------------------------------------------------------------------

    def _series_for(self, chart: str, name: str, color, dashed: bool = False,
                    scatter: bool = False, legend: bool = True) -> _Series:
        key = (chart, name)
        series = self._series.get(key)
        if series is None:
            plot = self.plots[chart]
            if scatter:
                item = pg.ScatterPlotItem(symbol="o", size=9, pen=pg.mkPen(color, width=2),
                                          brush=None)
                plot.addItem(item)
            else:
                style = Qt.PenStyle.DashLine if dashed else Qt.PenStyle.SolidLine
                item = plot.plot(pen=pg.mkPen(color, width=2, style=style),
                                 name=html.escape(name) if legend else None)  # legends are HTML
            series = _Series(item, RingBuffer(self.capacity), RingBuffer(self.capacity))
            self._series[key] = series
        return series

    def _add(self, chart: str, name: str, x: float, y: float | None, color, **style) -> None:
        if y is None or not math.isfinite(y):
            return
        series = self._series_for(chart, name, color, **style)
        series.x.append(x)
        series.y.append(y)
        series.dirty = True
        self._notes[chart].setVisible(False)

    def add_step(self, s: StepSample) -> None:
        color = precision_color(s.precision)
        p = s.precision
        self._add("loss", p, s.step, s.loss, color)
        if s.loss_scale is not None and s.loss_scale > 0:
            scale = math.log2(s.loss_scale)
            self._add("loss_scale", p, s.step, scale, color)
            if s.skipped:
                self._add("loss_scale", f"{p} skipped", s.step, scale, color, scatter=True)
        self._add("step_time", p, s.step, s.step_ms / 1000.0, color)
        self._add("throughput", p, s.step, s.tokens_per_s, color)
        self._add("mfu", p, s.step, None if s.mfu is None else s.mfu * 100.0, color)
        self._add("memory", p, s.step, _mib(s.allocated_bytes), color)
        self._add("memory", f"{p} reserved", s.step, _mib(s.reserved_bytes), color, dashed=True,
                  legend=False)

    def add_monitor(self, m: MonitorSample) -> None:
        if self._t0 is None:
            self._t0 = m.time_s
        t = m.time_s - self._t0
        if m.source == "host":
            self._use_host_titles()
            self._add("monitor_util", "CPU %", t, m.cpu_pct, MONITOR_COLORS[0])
            self._add("monitor_memory", "process RSS", t, _mib(m.host_rss_bytes),
                      MONITOR_COLORS[0])
            self._add("monitor_power", "host used", t, _mib(m.host_mem_used_bytes),
                      MONITOR_COLORS[0])
            return
        self._add("monitor_util", "GPU %", t, m.gpu_util_pct, MONITOR_COLORS[0])
        self._add("monitor_util", "memory bus %", t, m.mem_util_pct, MONITOR_COLORS[1])
        self._add("monitor_memory", "device used", t, _mib(m.gpu_mem_used_bytes),
                  MONITOR_COLORS[0])
        self._add("monitor_memory", "this process", t, _mib(m.process_mem_bytes),
                  MONITOR_COLORS[1])
        self._add("monitor_power", "power", t, m.power_w, MONITOR_COLORS[0])

    def begin(self, time_s: float) -> None:
        """The run's start: monitor charts count seconds from here."""
        self._t0 = time_s

    def mark_trial_start(self, precision: str, time_s: float) -> None:
        """A labelled vertical line on the monitor charts where a trial began."""
        if self._t0 is None:
            self._t0 = time_s
        for key in ("monitor_util", "monitor_memory", "monitor_power"):
            # labels step down so neighbouring short trials do not overprint each other
            position = 0.95 - 0.12 * ((len(self._trial_lines) // 3) % 4)
            line = pg.InfiniteLine(
                pos=time_s - self._t0, angle=90,
                pen=pg.mkPen(precision_color(precision), width=1, style=Qt.PenStyle.DotLine),
                label=precision.replace("{", "{{").replace("}", "}}"),  # a format string
                labelOpts={"position": position, "color": precision_color(precision)},
            )
            self.plots[key].addItem(line)
            self._trial_lines.append((self.plots[key], line))

    def note_trial(self, trial: TrialResult) -> None:
        """Keep the engine's reason for a value it could not give, for charts left empty."""
        summary, memory = trial.summary, trial.memory
        if summary is not None and summary.mfu is None and summary.mfu_reason:
            self._reasons.setdefault("mfu", f"MFU n/a: {summary.mfu_reason}")
        if memory is not None and memory.peak_allocated_bytes is None and memory.notes:
            self._reasons.setdefault("memory", f"allocator counters n/a: {memory.notes}")

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
            self.plots[key].setTitle(title, size="10pt")
            self.plots[key].setLabel("left", label, units=units)

    # --- whole runs -------------------------------------------------------------------

    def clear(self) -> None:
        for series in self._series.values():
            series.x.clear()
            series.y.clear()
            series.dirty = True
        for plot, line in self._trial_lines:
            plot.removeItem(line)
        self._trial_lines.clear()
        self._t0 = None
        self._host = False
        self._reasons.clear()
        for key, (title, label, units) in CHARTS.items():
            self.plots[key].setTitle(title, size="10pt")
            self.plots[key].setLabel("left", label, units=units)
        for chart in self._notes:
            self._set_note(chart, "no data yet")
        self.flush()

    def show_record(self, record: RunRecord, precisions: list[str]) -> None:
        """Replay a finished or loaded run through the live path."""
        self.clear()
        self.begin(record.started_s)
        for trial in record.trials:
            if trial.started_s:
                self.mark_trial_start(trial.precision, trial.started_s)
        for p in precisions:
            for step in record.steps(p):
                self.add_step(step)
        for sample in record.monitor_samples:
            self.add_monitor(sample)
        for trial in record.trials:
            self.note_trial(trial)
        self.finish()

    def finish(self) -> None:
        """Draw what is pending and mark charts the run left empty as n/a."""
        self.flush()
        for chart in CHARTS:
            self._set_note(chart, self._reasons.get(chart, "n/a: not reported for this run"))

    # --- drawing --------------------------------------------------------------------

    def flush(self) -> None:
        for series in self._series.values():
            if not series.dirty:
                continue
            series.dirty = False
            series.item.setData(series.x.view(), series.y.view())

    def curve_points(self, chart: str, name: str) -> int:
        """How many points the drawn curve was given (0 when it was never drawn)."""
        series = self._series.get((chart, name))
        if series is None:
            return 0
        if isinstance(series.item, pg.ScatterPlotItem):
            return len(series.item.data)
        return 0 if series.item.xData is None else len(series.item.xData)
