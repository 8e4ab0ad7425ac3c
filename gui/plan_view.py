"""The Plan view: will a model train on a card this machine does not have?

The form is the ``plan`` command's. ``PlanWorker`` runs ``engine.run.plan.plan`` in a thread
(one training step per recipe traced on fake tensors: nothing is allocated) and hands
the result back as a signal; the view shows the answer per card on top (fits or not, and
the smallest change that makes it fit), then a recipe x card table: the recipes asked, and
each change the answer planned (int8, nf4, ...) on the card it was planned for. Progress is
shown per trace (recipe and micro-batch) and each recipe's row as soon as it is judged;
Stop ends the plan between traces and keeps the rows done. A model that cannot be planned
shows its reason on top instead, and no table.
"""

from __future__ import annotations

import threading
import traceback

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine.core.config import STRATEGIES
from gui.palette import precision_color
from gui.plain_text import plain_label


class PlanStopped(BaseException):
    """Raised in the plan's thread at its next trace once Stop is pressed: a BaseException,
    so the plan's handlers of a trace that failed (recorded as the recipe's reason) let it
    through."""


class PlanWorker(QObject):
    finished = Signal(object)  # engine.run.plan.PlanResult
    errored = Signal(str)
    progress = Signal(str)  # what is traced now: the recipe and micro-batch
    partial = Signal(object)  # the PlanResult so far, after each recipe asked is judged
    stopped = Signal(object)  # the last partial PlanResult, or None: nothing was done

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, config) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(config,), name="ampscope-plan",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _log(self, message: str) -> None:  # called by the plan before each trace
        if self._stop.is_set():
            raise PlanStopped
        self.progress.emit(message)

    def _run(self, config) -> None:
        from engine.run.plan import plan
        from engine.run.plan_bounds import check_plan_bounds

        done = [None]

        def on_trial(result) -> None:
            done[0] = result
            self.partial.emit(result)

        try:
            check_plan_bounds(config)  # as the CLI: a trace this machine cannot finish
            result = plan(config, self._log, on_trial)
        except PlanStopped:
            self.stopped.emit(done[0])
            return
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
    from engine.run.plan_text import duration_text

    batch = "n/a" if card.max_batch is None else str(card.max_batch)
    step = ("n/a" if card.predicted_step_ms is None
            else f"{duration_text(card.predicted_step_ms)} ({card.bound}-bound)")
    tip = (f"usable {card.usable_bytes / 2**30:.2f} GiB ({card.memory_source}); largest "
           f"micro-batch {batch} ({card.max_batch_note}); step {step}: "
           f"{card.prediction_model}")
    return text, tip


def measured_text(trial) -> tuple[str, str]:
    """The measured twin's peak, and a tooltip with every category beside the traced."""
    from engine.run.plan_text import side_by_side, size_text

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
        self.worker.progress.connect(self._on_progress)
        self.worker.partial.connect(self._on_partial)
        self.worker.stopped.connect(self._on_stopped)
        self._recipes = 0  # recipes asked in the plan running, for its progress
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
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("End the plan at its next trace; the recipes done stay")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(self.stop_plan)
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

        # two columns of fields: at 1366 x 768 one column left the charts about 60 px
        left, right = QFormLayout(), QFormLayout()
        left.addRow("Model", self.model)
        left.addRow("Precisions", self.precisions)
        left.addRow("Micro-batch", self.batch)
        seq = QHBoxLayout()  # one row with the sequence: the form stays five rows high
        seq.addWidget(self.seq, 1)
        seq.addWidget(self.checkpointing)
        left.addRow("Sequence length", seq)
        left.addRow("Cards", self.cards)
        right.addRow("Gradient accumulation (micro-batches)", self.grad_accum)
        right.addRow("Strategy (per-rank figures)", self.strategy)
        right.addRow("Ranks (--nproc-per-node)", self.nproc)
        right.addRow("Largest batch to search (0: none)", self.max_batch)
        right.addRow("Measured report (beside the run history)", self.measured)
        form = QHBoxLayout()
        form.addLayout(left, 1)
        form.addLayout(right, 1)
        buttons = QHBoxLayout()
        buttons.addWidget(self.plan_button, 1)
        buttons.addWidget(self.stop_button)
        page = QWidget()  # scrolled as a whole where the window is shorter than the charts
        layout = QVBoxLayout(page)
        layout.addWidget(self.error_label)  # a refusal's reason is the first thing shown
        layout.addWidget(self.answer)
        layout.addLayout(form)
        layout.addLayout(buttons)
        layout.addWidget(self.status)
        layout.addWidget(self.table)
        self.scroll = QScrollArea()
        self.scroll.setWidget(page)
        self.scroll.setWidgetResizable(True)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(self.scroll)
        from gui.payoff_view import PayoffView

        self.payoff = PayoffView()  # would fp8 pay, layer by layer, on each card planned
        layout.addWidget(self.payoff)
        self._cards: tuple[str, ...] = ()  # as the finished plan was asked for them
        self._layout = layout
        self._timeline = None  # each recipe's traced step across time: built on first plan

    @property
    def timeline(self):
        """The traced step's chart, built when first asked for: pyqtgraph stays off the
        window's start-up path (tests/gui/test_startup_path.py)."""
        if self._timeline is None:
            from gui.memory_timeline_view import MemoryTimelineView

            self._timeline = MemoryTimelineView()
            # its charts whole, not squeezed below the form and table
            self._timeline.setMinimumHeight(self._timeline.wanted_height())
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
        self.last_result = None  # the progress counts this plan's recipes
        self.table.setRowCount(0)
        self._recipes = len(config.precisions)
        self._cards = config.cards
        self.payoff.clear("The fp8 payoff table follows when the plan finishes.")
        self.status.setText(f"Planning {', '.join(config.precisions)}: starting…")
        self.plan_button.setEnabled(False)
        self.stop_button.setEnabled(True)
        self.worker.start(config)
        return True

    def stop_plan(self) -> None:
        if self.worker.is_running():
            self.worker.stop()
            self.stop_button.setEnabled(False)
            self.status.setText(f"Stopping at the next trace… {self.status.text()}")

    def _done_count(self) -> int:
        return len(self.last_result.trials) if self.last_result is not None else 0

    def _on_progress(self, message: str) -> None:
        if not self.stop_button.isEnabled():  # stopping: the last words stay
            return
        self.status.setText(f"{self._done_count()} of {self._recipes} recipes planned; "
                            f"now {message}…")

    def _on_partial(self, result) -> None:
        self.show_result(result)

    def _on_stopped(self, result) -> None:
        self.worker.join()
        self.plan_button.setEnabled(True)
        self.stop_button.setEnabled(False)
        done = len(result.trials) if result is not None else 0
        if result is not None:
            self.show_result(result)
        self.status.setText(f"Stopped: {done} of {self._recipes} recipes planned (their rows "
                            "are complete; no answer, which needs every recipe).")

    def _show_error(self, error: str | None) -> None:
        self.error_label.setText(error or "")
        self.error_label.setVisible(error is not None)

    def _on_errored(self, message: str) -> None:
        self.worker.join()
        self.plan_button.setEnabled(True)
        self.stop_button.setEnabled(False)
        self.status.setText("The plan did not run.")
        self.table.setRowCount(0)
        self._show_error(message.splitlines()[0])

    def _on_finished(self, result) -> None:
        self.worker.join()
        self.plan_button.setEnabled(True)
        self.stop_button.setEnabled(False)
        self.show_result(result)
        self.payoff.show_plan(result, self._cards)

    def show_result(self, result) -> None:
        from engine.run.plan_answer import answer_lines
        from engine.run.plan_text import size_text

        self.last_result = result
        lines = answer_lines(result)
        self.answer.setText("\n".join(lines))
        self.answer.setVisible(bool(lines))
        cards = [c.card for c in result.trials[0].cards] if result.trials else []
        headers = ["Recipe", "Traced peak", "Measured peak", *cards]
        levers: dict = {}  # a change the answer planned -> {card: trial}, one row each
        for label, card, trial in getattr(result, "lever_trials", None) or []:
            levers.setdefault(label, {})[card] = trial
        self.table.setColumnCount(len(headers))
        self.table.setHorizontalHeaderLabels(headers)
        self.table.setRowCount(len(result.trials) + len(levers))
        rows = [(t.precision, t, {c.card: c for c in t.cards}) for t in result.trials]
        rows += [(label, next(iter(on.values())),
                  {card: t.cards[0] for card, t in on.items()}) for label, on in levers.items()]
        for row, (label, trial, verdicts) in enumerate(rows):
            name = _cell(label, "" if row < len(result.trials)
                         else "planned by the answer: a change to what was asked")
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
            for col, card in enumerate(cards, start=3):
                verdict = verdicts.get(card)
                self.table.setItem(row, col, _cell(*card_text(verdict)) if verdict else
                                   _cell("not planned", "the answer planned this change for "
                                         "another card only"))
        self._fit_table()
        self.timeline.show_plan(result)
        accum = f" x {result.grad_accum} micro-batches" if result.grad_accum > 1 else ""
        if result.strategy != "none":
            accum += f"; {result.strategy.upper()}, per rank of {result.nproc_per_node}"
        self.status.setText(f"{result.model}: batch {result.batch_size} x {result.seq_len}"
                            f"{accum}; CUDA context allowance "
                            f"{result.context_bytes / 2**30:.2f} GiB")

    def _fit_table(self, most_rows: int = 6) -> None:
        """As high as its rows (up to ``most_rows``, the rest scrolled): the charts below
        get the height left."""
        shown = min(max(self.table.rowCount(), 1), most_rows)
        rows = sum(self.table.rowHeight(r) for r in range(shown)) if self.table.rowCount() \
            else self.table.verticalHeader().defaultSectionSize()
        self.table.setFixedHeight(rows + self.table.horizontalHeader().height()
                                  + 2 * self.table.frameWidth() + 2)

    def cell(self, row: int, header: str) -> str:
        for col in range(self.table.columnCount()):
            if self.table.horizontalHeaderItem(col).text() == header:
                return self.table.item(row, col).text()
        raise KeyError(header)
