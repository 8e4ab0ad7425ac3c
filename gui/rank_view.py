"""Distributed trials in Compare: memory by category per rank, and the spread of step times.

One group of bars per distributed trial, one stacked bar per rank (measured) with the
predicted total of the strategy beside it as a dashed outline; below, each rank's
median step time, so a slow rank stands out. Hidden when the record has no
distributed trial. A rank without measurements is written as its status, never zero.
"""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QVBoxLayout, QWidget

from engine.core.events import TrialResult
from engine.record.run_record import RunRecord
from gui import plot_style  # noqa: F401 (sets pyqtgraph's colours before any plot)
from gui.palette import MEMORY_CATEGORY_COLORS, precision_color
from gui.plain_text import plain_label

MIB = 2**20
BAR = 0.36
# RankMemory field -> (legend name, colour): the single-process colours where they match
RANK_CATEGORIES = {
    "sharded_params_bytes": ("parameters (shard)", MEMORY_CATEGORY_COLORS["parameters"]),
    "unsharded_params_bytes": ("all-gathered parameters", "#6A3D9A"),
    "grads_bytes": ("gradients", MEMORY_CATEGORY_COLORS["gradients"]),
    "optimizer_bytes": ("optimizer state", MEMORY_CATEGORY_COLORS["optimizer state"]),
    "activations_bytes": ("activations", MEMORY_CATEGORY_COLORS["activations"]),
    "comm_buffers_bytes": ("gradient buckets", "#B15928"),
}


def rank_slots(record: RunRecord) -> list[tuple[TrialResult, int]]:
    """(trial, index into its ranks) for every rank of every distributed trial, in order."""
    return [(t, i) for t in record.trials if t.ranks for i in range(len(t.ranks))]


class RankView(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.title = plain_label()  # quotes precisions from reports
        self.charts = pg.GraphicsLayoutWidget()
        self.memory = self.charts.addPlot(row=0, col=0)
        self.memory.setTitle("Memory per rank (left: measured, right: predicted total)",
                             size="10pt")
        self.memory.setLabel("left", "MiB")
        self.steps = self.charts.addPlot(row=1, col=0)
        self.steps.setTitle("Median step time per rank", size="10pt")
        self.steps.setLabel("left", "ms")
        for plot in (self.memory, self.steps):
            plot.showGrid(y=True, alpha=0.25)
            plot.setMouseEnabled(x=False, y=False)
        self.legend = self.memory.addLegend(offset=(-5, 5), labelTextSize="8pt", colCount=3)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.title)
        layout.addWidget(self.charts)
        self.bars: dict[str, list[float]] = {}  # category -> heights drawn, in slot order
        self.hide()

    def show_record(self, record: RunRecord) -> None:
        slots = rank_slots(record)
        self.setVisible(bool(slots))
        for plot in (self.memory, self.steps):
            plot.clear()
        self.legend.clear()
        self.bars = {}
        if not slots:
            return
        ticks = [(x, f"{t.precision}\nrank {t.ranks[i].rank}") for x, (t, i) in enumerate(slots)]
        for plot in (self.memory, self.steps):
            plot.getAxis("bottom").setTicks([ticks])
            plot.setXRange(-0.6, len(slots) - 0.4, padding=0)
        spreads = [f"{t.precision}: slowest rank {t.distributed.slowest_rank}, spread "
                   f"{t.distributed.step_spread_pct:.1f}%"
                   for t in record.trials if t.distributed and t.distributed.step_spread_pct
                   is not None]
        self.title.setText("Ranks. " + "; ".join(spreads) if spreads else "Ranks")
        self._draw_memory(slots)
        self._draw_steps(slots)

    def _status(self, plot, x: float, text: str) -> None:
        item = pg.TextItem(text, color="#555555", anchor=(0.5, 1.0))
        item.setPos(x, 0)
        plot.addItem(item)

    def _draw_memory(self, slots) -> None:
        bottoms = [0.0] * len(slots)
        for field, (name, color) in RANK_CATEGORIES.items():
            xs, heights, y0 = [], [], []
            for x, (trial, i) in enumerate(slots):
                m = trial.ranks[i].memory
                value = getattr(m, field) if m is not None else None
                if value:
                    xs.append(x - BAR / 2)
                    heights.append(value / MIB)
                    y0.append(bottoms[x])
                    bottoms[x] += value / MIB
            self.bars[name] = heights
            bars = pg.BarGraphItem(x=xs, y0=y0, height=heights, width=BAR, brush=color,
                                   pen=pg.mkPen("w", width=0.5))
            self.memory.addItem(bars)
            self.legend.addItem(bars, name)
        xs, heights = [], []
        for x, (trial, i) in enumerate(slots):
            rank = trial.ranks[i]
            if rank.memory is None:
                self._status(self.memory, x, rank.status)
            elif rank.predicted_memory is not None:
                xs.append(x + BAR / 2)
                heights.append(rank.predicted_memory.total_bytes / MIB)
        pen = pg.mkPen("#222222", width=1.5, style=Qt.PenStyle.DashLine)
        predicted = pg.BarGraphItem(x=xs, height=heights, width=BAR, brush=None, pen=pen)
        self.bars["predicted total"] = heights
        self.memory.addItem(predicted)
        self.legend.addItem(predicted, "predicted total")
        self.memory.setYRange(0, max([*bottoms, *heights, 1e-9]) * 1.7, padding=0)

    def _draw_steps(self, slots) -> None:
        xs, heights, brushes = [], [], []
        for x, (trial, i) in enumerate(slots):
            median = trial.ranks[i].median_step_ms
            if median is None:
                self._status(self.steps, x, trial.ranks[i].status)
                continue
            xs.append(x)
            heights.append(median)
            brushes.append(precision_color(trial.precision))
        self.bars["median step ms"] = heights
        if xs:
            self.steps.addItem(pg.BarGraphItem(x=xs, height=heights, width=0.6, brushes=brushes,
                                               pen=None))
        self.steps.setYRange(0, max(heights, default=1.0) * 1.18, padding=0)
