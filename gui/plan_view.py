"""The Plan view: will a model train on a card this machine does not have?

The form is the ``plan`` command's. ``PlanWorker`` runs ``engine.run.plan.plan`` in a thread
(one training step per recipe traced on fake tensors: nothing is allocated) and hands
the result back as a signal; the view shows the answer per card on top (fits or not, and
the smallest change that makes it fit), then a recipe x card table. A model that cannot be
planned shows its reason on top instead, and no table.
"""

from __future__ import annotations

import threading
import traceback

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QHeaderView,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine.core.config import STRATEGIES
from gui.palette import precision_color
from gui.plain_text import plain_label


class PlanWorker(QObject):
    finished = Signal(object)  # engine.run.plan.PlanResult
    errored = Signal(str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._thread: threading.Thread | None = None

    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, config) -> None:
        self._thread = threading.Thread(target=self._run, args=(config,), name="ampscope-plan",
                                        daemon=True)
        self._thread.start()

    def _run(self, config) -> None:
        from engine.run.plan import plan
        from engine.run.plan_bounds import check_plan_bounds

        try:
            check_plan_bounds(config)  # as the CLI: a trace this machine cannot finish
            result = plan(config)
        except ValueError as exc:
            self.errored.emit(str(exc))
            return
        except Exception as exc:  # shown in the view; the window stays up
            self.errored.emit(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            return
        self.finished.emit(result)

    def join(self, timeout_s: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)


def _cell(text: str, tooltip: str = "") -> QTableWidgetItem:
    item = QTableWidgetItem(text)
    item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEditable)
    if tooltip:
        item.setToolTip(tooltip)
    return item


def card_text(card) -> tuple[str, str]:
    """A table cell for one card: the verdict, and a tooltip with how it was reached."""
    if card.fits is None:
        return "n/a", card.reason or ""
    gib = abs(card.headroom_bytes) / 2**30
    text = (f"fits, {gib:.2f} GiB headroom" if card.fits
            else f"does not fit, short {gib:.2f} GiB")
    from engine.run.plan import duration_text

    batch = "n/a" if card.max_batch is None else str(card.max_batch)
    step = ("n/a" if card.predicted_step_ms is None
            else f"{duration_text(card.predicted_step_ms)} ({card.bound}-bound)")
    tip = (f"usable {card.usable_bytes / 2**30:.2f} GiB ({card.memory_source}); largest "
           f"micro-batch {batch} ({card.max_batch_note}); step {step}: "
           f"{card.prediction_model}")
    return text, tip


def measured_text(trial) -> tuple[str, str]:
    """The measured twin's peak, and a tooltip with every category beside the traced."""
    from engine.run.plan import side_by_side, size_text

    m = trial.measured
    if m is None:
        return "none", ("no real trial of this model, shape and recipe in the run history: "
                        "profile it to compare")
    rows = "\n".join(f"{row}: traced {traced}, measured {measured} ({diff})"
                     for row, traced, measured, diff in side_by_side(trial))
    return (f"{size_text(m.memory.total_bytes)} (run {m.run_id})",
            f"run {m.run_id} on {m.device}, from {m.source}\n{rows}")


class PlanView(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.last_result = None
        self.worker = PlanWorker(self)
        self.worker.finished.connect(self._on_finished)
        self.worker.errored.connect(self._on_errored)
        self.model = QLineEdit("llama-3-8b")
        self.precisions = QLineEdit("fp32,bf16-amp")
        self.batch = QSpinBox()
        self.batch.setRange(1, 1_000_000)
        self.batch.setValue(1)
        self.seq = QSpinBox()
        self.seq.setRange(1, 10_000_000)
        self.seq.setValue(2048)
        self.checkpointing = QCheckBox("Gradient checkpointing")
        self.grad_accum = QSpinBox()
        self.grad_accum.setRange(1, 100_000)
        self.grad_accum.setValue(1)
        self.strategy = QComboBox()
        self.strategy.addItems(STRATEGIES)
        self.nproc = QSpinBox()
        self.nproc.setRange(1, 100_000)
        self.nproc.setValue(1)
        self.cards = QLineEdit("RTX 4090,H100 SXM")
        self.max_batch = QSpinBox()
        self.max_batch.setRange(0, 4096)
        self.max_batch.setValue(0)
        self.measured = QLineEdit()
        self.measured.setPlaceholderText("optional: a JSON report or journal of a real run")
        self.plan_button = QPushButton("Plan")
        self.plan_button.clicked.connect(self.start_plan)
        self.error_label = plain_label()
        self.error_label.setStyleSheet("color: #B00020")
        self.error_label.hide()
        # the answer, one line per card: above everything else the plan shows
        self.answer = plain_label()
        self.answer.setWordWrap(True)
        self.answer.setStyleSheet("font-weight: bold")
        self.answer.hide()
        self.status = plain_label("Traces one training step per recipe on fake tensors: no GPU "
                                  "and no weights needed. Step times are roofline predictions.")
        self.table = QTableWidget(0, 0)
        self.table.horizontalHeader().setSectionResizeMode(
            QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)

        form = QFormLayout()
        form.addRow("Model", self.model)
        form.addRow("Precisions", self.precisions)
        form.addRow("Micro-batch", self.batch)
        form.addRow("Sequence length", self.seq)
        form.addRow("", self.checkpointing)
        form.addRow("Gradient accumulation (micro-batches)", self.grad_accum)
        form.addRow("Strategy (per-rank figures)", self.strategy)
        form.addRow("Ranks (--nproc-per-node)", self.nproc)
        form.addRow("Cards", self.cards)
        form.addRow("Largest batch to search (0: none)", self.max_batch)
        form.addRow("Measured report (beside the run history)", self.measured)
        layout = QVBoxLayout(self)
        layout.addWidget(self.error_label)  # a refusal's reason is the first thing shown
        layout.addWidget(self.answer)
        layout.addLayout(form)
        layout.addWidget(self.plan_button)
        layout.addWidget(self.status)
        layout.addWidget(self.table, 1)
        self._layout = layout
        self._timeline = None  # each recipe's traced step across time: built on first plan

    @property
    def timeline(self):
        """The traced step's chart, built when first asked for: pyqtgraph stays off the
        window's start-up path (tests/gui/test_startup_path.py)."""
        if self._timeline is None:
            from gui.memory_timeline_view import MemoryTimelineView

            self._timeline = MemoryTimelineView()
            self._layout.addWidget(self._timeline, 2)
        return self._timeline

    def config(self):
        from engine.run.plan import PlanConfig

        cards = tuple(c.strip() for c in self.cards.text().split(",") if c.strip())
        return PlanConfig(model=self.model.text().strip(), precisions=self.precisions.text(),
                          batch_size=self.batch.value(), seq_len=self.seq.value(),
                          grad_checkpointing=self.checkpointing.isChecked(),
                          grad_accum=self.grad_accum.value(), cards=cards,
                          strategy=self.strategy.currentText(),
                          nproc_per_node=self.nproc.value(),
                          max_batch=self.max_batch.value(),
                          measured=(self.measured.text().strip(),)
                          if self.measured.text().strip() else ())

    def start_plan(self) -> bool:
        if self.worker.is_running():
            return False
        try:
            config = self.config()
        except ValueError as exc:
            self._show_error(str(exc))
            return False
        self._show_error(None)
        self.answer.hide()
        self.table.setRowCount(0)
        self.status.setText(f"Tracing {', '.join(config.precisions)}…")
        self.plan_button.setEnabled(False)
        self.worker.start(config)
        return True

    def _show_error(self, error: str | None) -> None:
        self.error_label.setText(error or "")
        self.error_label.setVisible(error is not None)

    def _on_errored(self, message: str) -> None:
        self.worker.join()
        self.plan_button.setEnabled(True)
        self.status.setText("The plan did not run.")
        self.table.setRowCount(0)
        self._show_error(message.splitlines()[0])

    def _on_finished(self, result) -> None:
        self.worker.join()
        self.plan_button.setEnabled(True)
        self.show_result(result)

    def show_result(self, result) -> None:
        from engine.run.plan import size_text
        from engine.run.plan_answer import answer_lines

        self.last_result = result
        lines = answer_lines(result)
        self.answer.setText("\n".join(lines))
        self.answer.setVisible(bool(lines))
        cards = [c.card for c in result.trials[0].cards] if result.trials else []
        headers = ["Recipe", "Traced peak", "Measured peak", *cards]
        self.table.setColumnCount(len(headers))
        self.table.setHorizontalHeaderLabels(headers)
        self.table.setRowCount(len(result.trials))
        for row, trial in enumerate(result.trials):
            name = _cell(trial.precision)
            name.setForeground(precision_color(trial.precision))
            self.table.setItem(row, 0, name)
            peak = (f"{size_text(trial.memory.total_bytes)} ({trial.method})"
                    if trial.memory else "n/a")
            how = trial.reason or trial.memory.total_method
            if trial.autocast_policy:  # CUDA's op lists (the card's) or the CPU's
                how += f"\nautocast traced: {trial.autocast_policy}"
            if trial.scaling:  # scaled from cut models, or traced whole and why
                how += f"\n{trial.scaling}"
            self.table.setItem(row, 1, _cell(peak, how))
            self.table.setItem(row, 2, _cell(*measured_text(trial)))
            for col, card in enumerate(trial.cards, start=3):
                self.table.setItem(row, col, _cell(*card_text(card)))
        self.timeline.show_plan(result)
        accum = f" x {result.grad_accum} micro-batches" if result.grad_accum > 1 else ""
        if result.strategy != "none":
            accum += f"; {result.strategy.upper()}, per rank of {result.nproc_per_node}"
        self.status.setText(f"{result.model}: batch {result.batch_size} x {result.seq_len}"
                            f"{accum}; CUDA context allowance "
                            f"{result.context_bytes / 2**30:.2f} GiB")

    def cell(self, row: int, header: str) -> str:
        for col in range(self.table.columnCount()):
            if self.table.horizontalHeaderItem(col).text() == header:
                return self.table.item(row, col).text()
        raise KeyError(header)
