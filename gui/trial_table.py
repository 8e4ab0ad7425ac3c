"""One row per trial of the current run: status, progress, latest step, and why it stopped.

Filled from events while a run is live and from a ``RunRecord`` when a run is loaded;
a trial that could not run (unsupported, oom, error) shows its reason on its row, and one
that an exception ended has a Show button for the full traceback (the column is hidden while
no row has one).
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QHeaderView,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
)

from engine.core.config import warmup_steps
from engine.core.events import TRIAL_STATUSES, StepSample, TrialResult
from engine.record.compare import format_cell
from engine.run.phase_clock import WAITING, on_path_s
from gui.palette import precision_color
from gui.plain_text import as_html
from gui.traceback_dialog import TracebackDialog

HEADERS = ("Precision", "Status", "Progress", "Step time", "Throughput", "Time", "Traceback",
           "Reason")
TIME, TRACEBACK, REASON = (HEADERS.index(h) for h in ("Time", "Traceback", "Reason"))
STATUS_COLORS = {"ok": "#1B7F3B", "running": "#0072B2", "queued": "#777777"}
BUSY_COLOR = "#0072B2"  # a trial that is loading, warming up, measuring...
PROBLEM_COLOR = "#C00000"


def phase_cell(trial: TrialResult) -> tuple[str, str]:
    """The Time cell: the trial's seconds on the run's critical path, and a tooltip with each
    phase's seconds and share, so a slow trial says why."""
    times = trial.phase_times
    if not times:
        return "n/a", ("n/a: no phase times (a distributed trial, a user's own run, or a "
                       "report from before they were recorded)")
    total = sum(times.values()) or 1.0
    lines = [f"{phase}: {seconds:.2f} s ({seconds / total:.0%})"
             for phase, seconds in times.items()]
    path = on_path_s(times)
    lines.append(f"{path:.1f} s on the run's critical path" + (
        f" (spawn, imports and {WAITING} ran beside the trial before)" if WAITING in times
        else ""))
    return f"{path:.1f} s", "\n".join(lines)


def trial_units(config: dict, rounds: int = 1) -> int:
    """Progress units of one precision: every step it runs, the untimed ones included
    (each interleaved round warms up and watches memory again; the profiled step runs in the
    first round only)."""
    profiled = 1 if config.get("profile_step", True) else 0
    warmup = warmup_steps(config.get("warmup", 0))  # "--warmup 0" still warms up one step
    return max(1, rounds * (warmup + 1) + profiled + config.get("steps", 0))


class TrialTable(QTableWidget):
    def __init__(self, parent=None) -> None:
        super().__init__(0, len(HEADERS), parent)
        self.setHorizontalHeaderLabels(HEADERS)
        self.verticalHeader().hide()
        self.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        header = self.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        self._rows: dict[str, int] = {}
        self._steps_per_trial = 1
        self.setColumnHidden(TRACEBACK, True)
        self.traceback_dialog: TracebackDialog | None = None  # the one last opened

    def reset(self, precisions: list[str], steps_per_trial: int) -> None:
        """``steps_per_trial`` 0: not known (a user's own loop): the bars show busy."""
        self.setRowCount(0)
        self._rows.clear()
        self.setColumnHidden(TRACEBACK, True)
        self._steps_per_trial = max(0, steps_per_trial)
        for p in precisions:
            self._row(p)

    def _row(self, precision: str) -> int:
        if precision in self._rows:
            return self._rows[precision]
        row = self.rowCount()
        self.insertRow(row)
        self._rows[precision] = row
        name = QTableWidgetItem(precision)
        name.setForeground(precision_color(precision))
        font = name.font()
        font.setBold(True)
        name.setFont(font)
        self.setItem(row, 0, name)
        bar = QProgressBar()
        bar.setRange(0, self._steps_per_trial)
        bar.setValue(0)
        self.setCellWidget(row, 2, bar)
        for col in (1, 3, 4, TIME, TRACEBACK, REASON):
            self.setItem(row, col, QTableWidgetItem(""))
        for col in (3, 4, TIME):
            self.item(row, col).setTextAlignment(
                Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.set_status(precision, "queued")
        return row

    def set_status(self, precision: str, status: str, reason: str | None = None) -> None:
        row = self._row(precision)
        item = self.item(row, 1)
        item.setText(status)
        color = STATUS_COLORS.get(status)
        if color is None:
            color = PROBLEM_COLOR if status in TRIAL_STATUSES or status == "not run" else BUSY_COLOR
        item.setForeground(QColor(color))
        if reason is not None:
            self.item(row, REASON).setText(reason)
            self.item(row, REASON).setToolTip(as_html(reason))

    def add_step(self, s: StepSample) -> None:
        row = self._row(s.precision)
        if self._steps_per_trial:
            self.cellWidget(row, 2).setValue(min(s.step + 1, self._steps_per_trial))
        self.item(row, 3).setText(format_cell("median_step_ms", s.step_ms))
        self.item(row, 4).setText(format_cell("tokens_per_s", s.tokens_per_s))

    def set_steps_per_trial(self, units: int) -> None:
        self._steps_per_trial = max(1, units)
        for row in self._rows.values():
            self.cellWidget(row, 2).setRange(0, self._steps_per_trial)

    def set_progress(self, precision: str, value: int) -> None:
        if not self._steps_per_trial:
            return
        self.cellWidget(self._row(precision), 2).setValue(min(value, self._steps_per_trial))

    def finish_trial(self, trial: TrialResult) -> None:
        row = self._row(trial.precision)
        self.set_status(trial.precision, trial.status, trial.reason or "")
        bar = self.cellWidget(row, 2)
        if bar.maximum() == 0:  # an unknown length ended: the busy bar stops
            bar.setRange(0, 1)
        if trial.status == "ok":
            bar.setValue(bar.maximum())
        if trial.summary is not None:
            self.item(row, 3).setText(format_cell("median_step_ms", trial.summary.median_step_ms))
            self.item(row, 4).setText(format_cell("tokens_per_s", trial.summary.tokens_per_s))
        text, tip = phase_cell(trial)
        self.item(row, TIME).setText(text)
        self.item(row, TIME).setToolTip(tip)
        self._traceback_button(row, trial)

    def _traceback_button(self, row: int, trial: TrialResult) -> None:
        self.removeCellWidget(row, TRACEBACK)  # a trial of a later round may end otherwise
        if trial.traceback:
            button = QPushButton("Show")
            button.setToolTip("The full traceback of the exception that ended this trial "
                              "(Copy in the dialog, for a bug report)")
            button.clicked.connect(lambda: self._show_traceback(trial))
            self.setCellWidget(row, TRACEBACK, button)
        self.setColumnHidden(TRACEBACK, not any(
            self.cellWidget(r, TRACEBACK) for r in range(self.rowCount())))

    def _show_traceback(self, trial: TrialResult) -> None:
        if self.traceback_dialog is not None:
            self.traceback_dialog.close()
        self.traceback_dialog = TracebackDialog(trial.precision, trial.reason, trial.traceback,
                                                self)
        self.traceback_dialog.show()

    def traceback_button(self, precision: str) -> QPushButton | None:
        return self.cellWidget(self._rows[precision], TRACEBACK)

    def progress(self, precision: str) -> int:
        return self.cellWidget(self._rows[precision], 2).value()

    def cell_text(self, precision: str, column: str) -> str:
        return self.item(self._rows[precision], HEADERS.index(column)).text()

    def precisions(self) -> list[str]:
        return list(self._rows)

