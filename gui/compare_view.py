"""Side-by-side comparison of the trials of a run (or of trials picked from several).

At the top, the verdict (``engine.record.verdict``): which precision to train in, or why none.
Bars: memory by category per precision with the predicted total beside the measured
one, throughput with the speed-up vs fp32 written above it, MFU and peak memory. A
value the engine could not give is written as "n/a" where its bar would stand, never
drawn as a zero. Below, the comparison table from ``engine.record.compare``, sortable and
copyable as TSV.
"""

from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QFont, QGuiApplication, QKeySequence
from PySide6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QPushButton,
    QSplitter,
    QTableView,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from engine.core.events import TrialResult
from engine.record import spread
from engine.record.compare import (
    NOISY_RULE,
    baseline_reason,
    comparison_rows,
    format_bytes,
    format_cell,
    speed_verdict,
)
from engine.record.run_record import RunRecord
from engine.record.verdict import figure_text
from engine.record.verdict import verdict as recommend
from gui.chart_specs import COMPARE_CHARTS, MFU_TITLES
from gui.comparison_table import ComparisonModel, RawValueSortProxy, table_as_tsv
from gui.memory_timeline_view import MemoryTimelineView
from gui.mfu_captions import mfu_captions
from gui.palette import MEMORY_CATEGORY_COLORS, precision_color
from gui.plain_text import as_html, plain_label
from gui.plot_style import plain_axes  # also sets pyqtgraph's colours before any plot
from gui.quant_error_view import QuantErrorView
from gui.rank_view import RankView
from gui.run_origin import run_summary

BAR = 0.36  # bar width; measured and predicted memory bars sit side by side
MIB = 2**20  # memory axes in MiB, the binary unit of the table and the reports
EMPTY_TEXT = ("Nothing to compare yet. When a run ends (Run tab), or when you open a report "
              "(File > Open) or a past run (History), its precisions appear here side by side: "
              "memory by category, throughput, MFU, peak memory and the comparison table.")


CAPTION_PX = 22  # a caption's line above its bar, with a gap
LINE_PX = 14  # each further line of a caption (the MFU's peak, in a smaller font)


def _caption(text: str) -> pg.TextItem:
    """A caption above a bar; a second line (the peak an MFU divides by) smaller, centred."""
    first, _, rest = text.partition("\n")
    item = pg.TextItem(color="#222222", anchor=(0.5, 1.0))
    if not rest:
        item.setPlainText(first)
        return item
    item.setHtml(f'<div style="text-align:center">{html.escape(first)}<br>'
                 f'<span style="font-size:7pt">{html.escape(rest)}</span></div>')
    return item


def _mib(value: int | None) -> float | None:
    return None if value is None else value / MIB


def _memory_parts(trial: TrialResult) -> list[tuple[str, int | None]]:
    m = trial.memory
    return [
        ("parameters", m.params_bytes),
        ("gradients", m.grads_bytes),
        ("optimizer state", m.optimizer_bytes),
        ("weight copies", m.weight_copies_bytes or 0),  # 0 in reports from before them
        ("activations", m.activations_bytes),
        ("other", _other(m)),
    ]


def _other(m) -> int | None:
    """The rest of the measured peak: temporaries, buffers, quantisation state, the batch."""
    if m.temporaries_bytes is None:
        return None
    return sum(v or 0 for v in (m.temporaries_bytes, m.buffers_bytes, m.quant_state_bytes,
                                m.inputs_bytes))


class CompareView(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.record: RunRecord | None = None
        # the recommendation, first: names precisions and reasons from the record
        self.verdict_label = plain_label()
        self.verdict_label.setObjectName("verdict")
        self.verdict_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.verdict_label.hide()
        # which run this is: its device, model, shape and versions (a server's report too)
        self.run_label = plain_label()
        self.run_label.setObjectName("run_on_show")
        self.run_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.run_label.setStyleSheet("QLabel#run_on_show { font-weight: 600; }")
        self.run_label.hide()
        self.note = plain_label(EMPTY_TEXT)
        # the speed verdict: can this run rank the precisions? (names precisions: plain text)
        self.speed_note = plain_label()
        self.speed_note.setToolTip(f"Rule: {NOISY_RULE}.\nSpread: {spread.METHOD}.")
        self.charts = pg.GraphicsLayoutWidget()
        self.plots: dict[str, pg.PlotItem] = {}
        self._caption_tops: dict[str, float] = {}  # per chart, the highest caption's foot
        self._caption_lines: dict[str, int] = {}  # per chart, its captions' most lines
        for i, (key, (title, label, units)) in enumerate(COMPARE_CHARTS.items()):
            if key == "memory":  # its legend in a row of its own above it, off the bars
                cell = self.charts.addLayout(row=i // 2, col=i % 2)
                cell.setContentsMargins(0, 0, 0, 0)
                self.memory_legend = pg.LegendItem(labelTextSize="8pt", colCount=4,
                                                   frame=False)
                cell.addItem(self.memory_legend, row=0, col=0)
                plot = cell.addPlot(row=1, col=0)
            else:
                plot = self.charts.addPlot(row=i // 2, col=i % 2)
            plot.setTitle(title, size="10pt")
            plot.setLabel("left", label, units=units)
            plain_axes(plot)
            plot.showGrid(y=True, alpha=0.25)
            plot.setMouseEnabled(x=False, y=False)
            self.plots[key] = plot
            plot.getViewBox().sigResized.connect(lambda _box, key=key: self._fit_captions(key))

        self.model = ComparisonModel(self)
        self.proxy = RawValueSortProxy(self)
        self.proxy.setSourceModel(self.model)
        self.table = QTableView()
        self.table.setModel(self.proxy)
        self.table.setSortingEnabled(True)
        # run order until the user clicks a header
        self.table.horizontalHeader().setSortIndicator(-1, Qt.SortOrder.AscendingOrder)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.copy_action = QAction("Copy table as TSV", self)
        self.copy_action.setShortcut(QKeySequence.StandardKey.Copy)
        self.copy_action.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        self.copy_action.triggered.connect(self.copy_table)
        self.table.addAction(self.copy_action)
        copy_button = QPushButton("Copy")
        copy_button.setToolTip("Put the table on the clipboard as tab-separated text")
        copy_button.clicked.connect(self.copy_table)

        table_box = QWidget()
        table_layout = QVBoxLayout(table_box)
        table_layout.setContentsMargins(0, 0, 0, 0)
        table_layout.addWidget(self.speed_note)
        bar = QHBoxLayout()
        bar.addWidget(self.note, 1)
        bar.addWidget(copy_button)
        table_layout.addLayout(bar)
        table_layout.addWidget(self.table)
        # why an MFU is n/a, under the charts: written across the chart it covered a bar
        self.mfu_note = plain_label()
        self.mfu_note.setStyleSheet("color: #555555;")
        self.mfu_note.hide()
        charts_box = QWidget()
        charts_layout = QVBoxLayout(charts_box)
        charts_layout.setContentsMargins(0, 0, 0, 0)
        charts_layout.addWidget(self.charts, 1)
        charts_layout.addWidget(self.mfu_note)
        splitter = QSplitter(Qt.Orientation.Vertical)
        splitter.addWidget(charts_box)
        self.ranks = RankView()  # distributed trials only
        splitter.addWidget(self.ranks)
        self.quant_error = QuantErrorView()
        self.tables = QTabWidget()  # the comparison table, and each trial's SQNR beside it
        self.tables.addTab(table_box, "Comparison table")
        self.tables.addTab(self.quant_error, "Quantisation error (SQNR)")
        self.timeline = MemoryTimelineView()  # each precision's memory step, side by side
        self.tables.addTab(self.timeline, "Memory across the step")
        from gui.payoff_view import PayoffView

        self.payoff = PayoffView()  # would fp8 pay on the card the run ran on
        self.tables.addTab(self.payoff, "fp8 payoff")
        self.payoff.finished.connect(lambda: self._room_for_timeline(0))  # its text came
        splitter.addWidget(self.tables)
        splitter.setStretchFactor(0, 3)
        splitter.setStretchFactor(2, 1)
        splitter.setSizes([480, 300, 380])  # room for the speed note and every row at 768 px
        self.split = splitter
        self._sizes_before_timeline: list[int] | None = None  # given back on leaving it
        self.tables.currentChanged.connect(self._room_for_timeline)
        layout = QVBoxLayout(self)
        layout.addWidget(self.run_label)
        layout.addWidget(self.verdict_label)
        layout.addWidget(splitter, 1)

    def _room_for_timeline(self, _index: int) -> None:
        """The memory timeline's plots (and the fp8 payoff's rows) need height: choosing its
        tab gives the lower pane what it needs, taken from the bar charts above; leaving it
        gives them back."""
        tall = (self.timeline, self.payoff)  # tabs that need more than the pane's default
        if self.tables.currentWidget() not in tall:
            if self._sizes_before_timeline is not None:
                self.split.setSizes(self._sizes_before_timeline)
                self._sizes_before_timeline = None
            return
        sizes = self.split.sizes()
        need = self.tables.currentWidget().wanted_height() + self.tables.tabBar().height() + 8
        if sizes[2] < need and sum(sizes) > need:
            if self._sizes_before_timeline is None:  # the sizes before any tall tab
                self._sizes_before_timeline = sizes
            self.split.setSizes([sum(sizes) - need - sizes[1], sizes[1], need])

    # --- filling ---------------------------------------------------------------------

    def show_record(self, record: RunRecord, note: str | None = None) -> None:
        self.record = record
        self.run_label.setText(f"Run {record.run_id or 'n/a'} on {run_summary(record)}")
        self.run_label.show()
        self._show_verdict(record)
        self.ranks.show_record(record)
        verdict = speed_verdict(record.trials)
        rows = comparison_rows(record, verdict)
        self.model.set_rows(rows)
        self.quant_error.show_record(record, {r.precision: r.final_loss_diff_vs_fp32 for r in rows})
        self.timeline.show_record(record)
        self.payoff.show_record(record)
        reasons = [note, baseline_reason(record)]
        self.note.setText("  ".join(r for r in reasons if r))
        suggestion = f" Suggestion: {verdict.suggestion}." if verdict.suggestion else ""
        self.speed_note.setText(f"Speed: {verdict.text}.{suggestion}")
        self.speed_note.setStyleSheet("color: #C00000; font-weight: bold;" if verdict.noisy
                                      else "")
        labels = [t.precision for t in record.trials]
        self._caption_tops.clear()
        self._caption_lines.clear()
        for plot in self.plots.values():
            plot.clear()
            plot.getAxis("bottom").setTicks([list(enumerate(labels))])
            plot.setXRange(-0.6, len(labels) - 0.4, padding=0)
        self._draw_memory(record.trials)
        values = {r.precision: r for r in rows}
        self._draw_bars("throughput", labels, [values[p].tokens_per_s for p in labels],
                        [format_cell("speedup_vs_fp32", values[p].speedup_vs_fp32) + " vs fp32"
                         if values[p].tokens_per_s is not None
                         and values[p].speedup_vs_fp32 is not None else None for p in labels],
                        record.trials,
                        # the label sits above the whisker, which would strike it through
                        [values[p].tokens_per_s_ci[1] if values[p].tokens_per_s_ci else None
                         for p in labels])
        self._draw_intervals("throughput", [values[p].tokens_per_s for p in labels],
                             [values[p].tokens_per_s_ci for p in labels])
        # the datasheet peak where a trial has one; else the measured matmul peak (a CPU)
        kind = "datasheet" if any(values[p].mfu is not None for p in labels) or not any(
            values[p].mfu_measured is not None for p in labels) else "measured"
        if any(values[p].mfu_common is not None for p in labels):
            kind = "common"  # one denominator: recipes compare like with like
        field = {"datasheet": "mfu", "measured": "mfu_measured", "common": "mfu_common"}[kind]
        self.plots["mfu"].setTitle(html.escape(MFU_TITLES[kind]), size="10pt")
        mfu = [None if getattr(values[p], field) is None else getattr(values[p], field) * 100
               for p in labels]
        self._draw_bars("mfu", labels, mfu, mfu_captions(record.trials, mfu, field),
                        record.trials)
        self._explain_missing_mfu(record.trials, mfu, f"{field}_reason")
        peaks = [values[p].peak_memory_bytes for p in labels]
        self._draw_bars("peak_memory", labels, [_mib(v) for v in peaks],
                        [None if v is None else format_bytes(v) for v in peaks], record.trials)

    def _show_verdict(self, record: RunRecord) -> None:
        v = recommend(record)
        self.verdict_label.setText(v.headline + (f"\nTo do: {v.advice}" if v.advice else ""))
        why = [f"{f.precision}: {f.judgement}: {figure_text(f)} ({f.note})" for f in v.figures]
        self.verdict_label.setToolTip(as_html("\n".join([*why, *v.reasons, f"Rules: {v.rules}."])))
        # green for a recommendation, amber when there is none (a run to repeat)
        color = "#E8F5EC; border: 1px solid #9FD3B5" if v.precision else \
            "#FDF6E3; border: 1px solid #E8C77A"
        self.verdict_label.setStyleSheet(f"QLabel#verdict {{ background: {color}; "
                                         "border-radius: 4px; padding: 6px; font-size: 11pt; "
                                         "font-weight: 600; }")
        self.verdict_label.show()

    def _explain_missing_mfu(self, trials: list[TrialResult], mfu: list[float | None],
                             reason_field: str) -> None:
        """The engine's reasons for n/a MFU, under the charts, naming the trials."""
        reasons: dict[str, list[str]] = {}
        for t, v in zip(trials, mfu, strict=True):
            why = getattr(t.summary, reason_field) if t.summary is not None else None
            if v is None and why:
                reasons.setdefault(why, []).append(t.precision)
        self.mfu_note.setText("  ".join(f"MFU n/a for {', '.join(names)}: {why}"
                                        for why, names in reasons.items()))
        self.mfu_note.setVisible(bool(reasons))

    def _na(self, plot: pg.PlotItem, x: float, trial: TrialResult) -> None:
        """Text where a bar would stand: n/a, or the trial's status when it did not finish."""
        text = "n/a" if trial.status == "ok" else trial.status
        item = pg.TextItem(text, color="#555555", anchor=(0.5, 1.0))
        item.setPos(x, 0)
        plot.addItem(item)

    def _draw_bars(self, key: str, labels: list[str], values: list[float | None],
                   captions: list[str | None], trials: list[TrialResult],
                   caption_at: list[float | None] | None = None) -> None:
        plot = self.plots[key]
        present = [i for i, v in enumerate(values) if v is not None]
        if present:
            plot.addItem(pg.BarGraphItem(
                x=present, height=[values[i] for i in present], width=0.6,
                brushes=[precision_color(labels[i]) for i in present], pen=None))
        feet = [max(values[i], caption_at[i]) if caption_at and caption_at[i] is not None
                else values[i] for i in present]
        self._room_for_captions(key, max(feet, default=1.0) or 1.0,
                                max((c.count("\n") + 1 for c in captions if c), default=1))
        for i, trial in enumerate(trials):
            if values[i] is None:
                self._na(plot, i, trial)
            elif captions[i]:
                text = _caption(captions[i])
                above = caption_at[i] if caption_at and caption_at[i] is not None else None
                text.setPos(i, max(values[i], above) if above is not None else values[i])
                plot.addItem(text)

    def _draw_intervals(self, key: str, values: list[float | None],
                        intervals: list[tuple[float, float] | None]) -> None:
        """Whiskers over the bars: each value's confidence interval, where it has one."""
        shown = [i for i, ci in enumerate(intervals) if ci is not None and values[i] is not None]
        if not shown:
            return
        plot = self.plots[key]
        plot.addItem(pg.ErrorBarItem(
            x=np.array(shown, dtype=float), y=np.array([values[i] for i in shown]),
            top=np.array([intervals[i][1] - values[i] for i in shown]),
            bottom=np.array([values[i] - intervals[i][0] for i in shown]),
            beam=0.2, pen=pg.mkPen("#222222", width=1.2)))
        self._room_for_captions(key, max(intervals[i][1] for i in shown))

    def _room_for_captions(self, key: str, top: float, lines: int = 1) -> None:
        """Keep room above ``top`` (the foot of the highest caption or whisker) for captions
        of ``lines`` lines."""
        self._caption_tops[key] = max(top, self._caption_tops.get(key, 0.0))
        self._caption_lines[key] = max(lines, self._caption_lines.get(key, 1))
        self._fit_captions(key)

    def _fit_captions(self, key: str) -> None:
        """A caption is a line of text, a fixed height in pixels: a short chart (the
        Compare tab at 768 px) needs a larger share of its range above the bars than a
        tall one, so the range follows the chart's height as it is resized."""
        top = self._caption_tops.get(key)
        if not top:
            return
        plot = self.plots[key]
        height = plot.getViewBox().height()
        pixels = CAPTION_PX + LINE_PX * (self._caption_lines.get(key, 1) - 1)
        share = min(0.6, pixels / height) if height > 0 else 0.3
        plot.setYRange(0, top / (1 - share), padding=0)

    def _draw_memory(self, trials: list[TrialResult]) -> None:
        plot = self.plots["memory"]
        legend = self.memory_legend
        legend.clear()
        bottoms = [0.0] * len(trials)
        top = 0.0
        for category, color in MEMORY_CATEGORY_COLORS.items():
            xs, heights, y0 = [], [], []
            for i, trial in enumerate(trials):
                if trial.memory is None:
                    continue
                value = _mib(dict(_memory_parts(trial))[category])
                if value:
                    xs.append(i - BAR / 2)
                    heights.append(value)
                    y0.append(bottoms[i])
                    bottoms[i] += value
            bars = pg.BarGraphItem(x=xs, y0=y0, height=heights, width=BAR, brush=color,
                                   pen=pg.mkPen("w", width=0.5))
            plot.addItem(bars)
            legend.addItem(bars, category)
        predicted_pen = pg.mkPen("#222222", width=1.5, style=Qt.PenStyle.DashLine)
        predicted = pg.BarGraphItem(x=[], height=[], width=BAR, brush=None, pen=predicted_pen)
        xs, heights = [], []
        for i, trial in enumerate(trials):
            if trial.memory is None:
                self._na(plot, i, trial)
                continue
            top = max(top, bottoms[i])
            missing = [name for name, v in _memory_parts(trial) if v is None]
            if missing:
                note = pg.TextItem("n/a: " + ", ".join(missing), color="#555555",
                                   anchor=(0.5, 1.0))
                note.setFont(QFont(note.textItem.font().family(), 8))
                note.setPos(i - BAR / 2, bottoms[i])
                plot.addItem(note)
            if trial.predicted_memory is not None:
                xs.append(i + BAR / 2)
                heights.append(_mib(trial.predicted_memory.total_bytes))
                top = max(top, heights[-1])
        predicted.setOpts(x=xs, height=heights)
        plot.addItem(predicted)
        legend.addItem(predicted, "predicted total")
        plot.setYRange(0, (top or 1.0) * 1.15, padding=0)  # the legend sits above the plot

    # --- clipboard -------------------------------------------------------------------

    def table_tsv(self) -> str:
        return table_as_tsv(self.proxy)

    def copy_table(self) -> None:
        QGuiApplication.clipboard().setText(self.table_tsv())
