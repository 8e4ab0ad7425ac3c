"""Where each precision's profiled step spent its time: matmuls by dtype, elementwise and
normalisation, copies, optimizer, GradScaler, idle gaps and Tensor Core share (GPU), and
the ops (and GPU kernels) of one precision, most time first.

A value the engine could not give reads "n/a" with the reason in its tooltip.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine.core.events import TrialResult
from engine.record.run_record import RunRecord
from gui.palette import precision_color
from gui.plain_text import plain_label
from gui.profiled_reason import in_words

SUMMARY_HEADERS = ("Precision", "Profiled step", "Matmul by dtype", "Elementwise/norm",
                   "Copy/cast", "Optimizer", "GradScaler", "Idle gaps", "Matmul on Tensor Cores",
                   "Tensor pipes (GPM)")
_CATEGORY_COLUMNS = ("elementwise/normalisation", "copy/cast", "optimizer", "GradScaler")
OP_HEADERS = ("Op", "dtype", "Category", "Calls", "Self ms", "Share of step")
KERNEL_HEADERS = ("Kernel", "Op", "dtype", "Calls", "ms", "Tensor Core")


def _pct(share: float | None) -> str:
    if share is None:
        return "n/a"
    return "<0.1%" if 0 < share < 0.001 else f"{100 * share:.1f}%"


class _Item(QTableWidgetItem):
    """Sorts by the number it holds (UserRole) when it has one, else by its text."""

    def __lt__(self, other) -> bool:
        mine, theirs = self.data(Qt.ItemDataRole.UserRole), other.data(Qt.ItemDataRole.UserRole)
        if mine is not None and theirs is not None:
            return mine < theirs
        return self.text() < other.text()


def _cell(text: str, tooltip: str = "", number: float | None = None) -> QTableWidgetItem:
    item = _Item(text)
    item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEditable)
    if tooltip:
        item.setToolTip(tooltip)
    if number is not None:
        item.setData(Qt.ItemDataRole.UserRole, number)
        item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    return item


def _rate(pct: float | None) -> str:
    """A GPM rate in percent; n/a where NVML gave none (its NaN, read as None)."""
    return "n/a" if pct is None else f"{pct:.1f}%"


def summary_cells(trial: TrialResult, record=None) -> list[tuple[str, str]]:
    """(text, tooltip) per summary column after the precision; ``record``: the run it is
    from (names the AmpScope and torch of a report whose profiled step failed)."""
    ps = trial.profiled_step
    g = trial.gpm
    if g is None:
        gpm = ("n/a", "the trial did not train")
    elif g.reason:
        gpm = ("n/a", g.reason)
    else:
        gpm = (_pct(g.tensor_any_util_pct / 100 if g.tensor_any_util_pct is not None else None),
               f"NVML GPM over {g.window}: HMMA {_rate(g.tensor_hmma_util_pct)}, "
               f"SM active {_rate(g.sm_util_pct)}, DRAM bandwidth {_rate(g.dram_bw_util_pct)}"
               + (f"; {g.na_reason}" if g.na_reason else ""))
    if ps is None:
        words, details = in_words(trial.profiled_step_reason or trial.reason, record)
        why = f"{words}\n\n{details}" if details else words
        return [("n/a", why)] * (len(SUMMARY_HEADERS) - 2) + [gpm]
    matmul = ", ".join(f"{_pct(v)} {k}" for k, v in ps.matmul_share_by_dtype.items()) or "none"
    return [
        (f"{ps.step_ms:.1f} ms", ps.time_basis),
        (matmul, "share of the profiled step in matmul ops, by the dtype they ran in"),
        *[(_pct(ps.category_share.get(c)), c) for c in _CATEGORY_COLUMNS],
        (_pct(ps.idle_gap_share), ps.idle_gap_reason or "time with no kernel running"),
        (_pct(ps.tensor_core_share), ps.tensor_core_reason or "by kernel names"),
        gpm,
    ]


class KernelView(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.record: RunRecord | None = None
        # notes quote precisions and reasons from reports: never read as markup
        self.note = plain_label("Run a trial: each precision gets one extra profiled step.")
        self.summary = QTableWidget(0, len(SUMMARY_HEADERS))
        self.summary.setHorizontalHeaderLabels(SUMMARY_HEADERS)
        self.summary.verticalHeader().setVisible(False)
        self.summary.horizontalHeader().setSectionResizeMode(
            QHeaderView.ResizeMode.ResizeToContents)
        self.precision = QComboBox()
        self.precision.currentTextChanged.connect(self._show_ops)
        self.ops = QTableWidget(0, len(OP_HEADERS))
        self.ops.setHorizontalHeaderLabels(OP_HEADERS)
        self.ops.verticalHeader().setVisible(False)
        self.ops.setSortingEnabled(True)
        self.kernels = QTableWidget(0, len(KERNEL_HEADERS))
        self.kernels.setHorizontalHeaderLabels(KERNEL_HEADERS)
        self.kernels.verticalHeader().setVisible(False)
        self.detail_note = plain_label()
        for table in (self.ops, self.kernels):
            table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
            table.horizontalHeader().setStretchLastSection(True)

        pick = QHBoxLayout()
        pick.addWidget(QLabel("Ops of"))
        pick.addWidget(self.precision)
        pick.addStretch(1)
        lower = QWidget()
        lower_layout = QVBoxLayout(lower)
        lower_layout.setContentsMargins(0, 0, 0, 0)
        lower_layout.addLayout(pick)
        lower_layout.addWidget(self.detail_note)
        tables = QSplitter(Qt.Orientation.Horizontal)
        tables.addWidget(self.ops)
        tables.addWidget(self.kernels)
        lower_layout.addWidget(tables, 1)
        self.split = split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.summary)
        split.addWidget(lower)
        split.setStretchFactor(1, 3)
        layout = QVBoxLayout(self)
        layout.addWidget(self.note)
        layout.addWidget(split, 1)

    def show_record(self, record: RunRecord) -> None:
        self.record = record
        trials = list(record.trials)
        self.summary.setRowCount(len(trials))
        for row, trial in enumerate(trials):
            name = _cell(trial.precision)
            name.setForeground(precision_color(trial.precision))
            self.summary.setItem(row, 0, name)
            for col, (text, tip) in enumerate(summary_cells(trial, record), start=1):
                self.summary.setItem(row, col, _cell(text, tip))
        self._fit_summary()
        profiled = [t for t in trials if t.profiled_step is not None]
        basis = {t.profiled_step.time_basis for t in profiled}
        self.note.setText(
            "One extra profiled step per precision, after the measured ones (profiling slows "
            "ops: read shares, not speed). " + " ".join(f"Time: {b}." for b in basis)
            if profiled else "No profiled step in this run: hover a row for the reason.")
        current = self.precision.currentText()
        self.precision.blockSignals(True)
        self.precision.clear()
        self.precision.addItems([t.precision for t in trials])
        self.precision.blockSignals(False)
        if current in [t.precision for t in trials]:
            self.precision.setCurrentText(current)
        self._show_ops(self.precision.currentText())

    def _fit_summary(self) -> None:
        """Every precision's row on show without a scroll bar, while the op and kernel
        tables keep at least half the tab (a sweep has up to about ten precisions)."""
        table = self.summary
        rows = sum(table.rowHeight(r) for r in range(table.rowCount()))
        scroll = table.horizontalScrollBar()
        needed = (table.horizontalHeader().sizeHint().height() + rows + 2 * table.frameWidth()
                  + (scroll.sizeHint().height() if scroll.maximum() > 0 else 0))
        total = sum(self.split.sizes()) or self.split.height()
        if total > 0:
            upper = min(needed, total // 2)
            self.split.setSizes([upper, total - upper])

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._fit_summary()

    def _show_ops(self, precision: str) -> None:
        trial = self.record.trial(precision) if self.record and precision else None
        ps = trial.profiled_step if trial else None
        self.ops.setSortingEnabled(False)
        self.ops.setRowCount(0 if ps is None else len(ps.ops))
        self.kernels.setRowCount(0 if ps is None else len(ps.kernels))
        if ps is None:
            words, details = in_words(trial.profiled_step_reason or trial.reason,
                                      self.record) if trial else ("", "")
            self.detail_note.setText(f"{precision}: n/a: {words}" if trial else "")
            self.detail_note.setToolTip(details)  # the raw failure, for a bug report
            self.ops.setSortingEnabled(True)
            return
        self.detail_note.setToolTip("")
        self.detail_note.setText(f"{precision}: {ps.dtype_method}. Peak memory of the step: "
                                 f"{ps.peak_memory_bytes / 2**20:.1f} MiB "
                                 f"({ps.peak_memory_method})" if ps.peak_memory_bytes else
                                 f"{precision}: {ps.dtype_method}")
        for row, o in enumerate(ps.ops):
            cells = [_cell(o.op), _cell(o.dtype), _cell(o.category),
                     _cell(str(o.calls), number=o.calls),
                     _cell(f"{o.self_ms:.3f}", number=o.self_ms),
                     _cell(_pct(o.step_share), number=o.step_share or 0.0)]
            for col, item in enumerate(cells):
                self.ops.setItem(row, col, item)
        self.ops.setSortingEnabled(True)
        self.ops.sortItems(OP_HEADERS.index("Self ms"), Qt.SortOrder.DescendingOrder)
        self.kernels.setVisible(bool(ps.kernels))
        for row, k in enumerate(ps.kernels):
            tc = "n/a (not a matmul)" if k.tensor_core is None else ("yes" if k.tensor_core
                                                                     else "no")
            cells = [_cell(k.name, k.name), _cell(k.op), _cell(k.dtype),
                     _cell(str(k.calls), number=k.calls), _cell(f"{k.ms:.3f}", number=k.ms),
                     _cell(tc)]
            for col, item in enumerate(cells):
                self.kernels.setItem(row, col, item)

    def summary_text(self, row: int, header: str) -> str:
        return self.summary.item(row, SUMMARY_HEADERS.index(header)).text()
