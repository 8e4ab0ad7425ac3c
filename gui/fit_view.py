"""The Fit view: the largest micro-batch per precision within a memory budget.

The model, precisions, sequence length, device and isolation come from the Run tab's
form; the budget and the search bound are asked for here. ``FitWorker`` runs
``engine.run.fit.run_fit`` in a thread (each probe a real trial in a child process) and
hands probes and results back as Qt signals; the view only shows them.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine.run.fit import CARDS, FitConfig, FitProbe, FitResult, budget_text, parse_bytes
from gui.palette import precision_color
from gui.plain_text import plain_label

RESULT_HEADERS = ("Precision", "Batch", "Memory", "Predicted", "Tokens/s", "Probes", "Note")
# each card by the capacity CUDA reports, in GiB of 2^30 bytes (not its nominal GB)
CARD_HEADERS = ("Precision", *[c.header for c in CARDS])
NOTE_HEADERS = ("Precision", "How the prediction was made")


class FitWorker(QObject):
    """Runs the batch search in a thread; probes and results come back as signals."""

    probe = Signal(str, object)  # precision, FitProbe
    result = Signal(object)  # FitResult, as each precision's search ends
    finished = Signal(object, object)  # budget bytes (may pass 2**31), list[FitResult]
    errored = Signal(str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, config: FitConfig) -> None:
        if self.is_running():
            raise RuntimeError("a batch search is already running")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(config,), name="ampscope-fit",
                                        daemon=True)
        self._thread.start()

    def _run(self, config: FitConfig) -> None:
        from engine.run.fit import FitCancelled, run_fit

        try:
            budget, results = run_fit(config, self.probe.emit, self._stop.is_set,
                                      self.result.emit)
        except FitCancelled:
            self.errored.emit("stopped before the search finished")
            return
        except ValueError as exc:
            self.errored.emit(str(exc))
            return
        except Exception as exc:  # shown in the view; the window stays up
            self.errored.emit(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            return
        self.finished.emit(budget, results)

    def stop(self) -> None:
        """End the search: the running probe's process is ended, nothing is reported."""
        self._stop.set()

    def join(self, timeout_s: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout_s)
        return not self.is_running()


def _mib(value) -> str:
    return "n/a" if value is None else f"{value / 2**20:.1f} MiB"


def _cell(text: str, tooltip: str = "") -> QTableWidgetItem:
    item = QTableWidgetItem(text)
    item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEditable)
    if tooltip:
        item.setToolTip(tooltip)
    return item


class FitView(QWidget):
    """``form_values`` returns the Run tab's form (model, precisions, seq_len, device...)."""

    def __init__(self, form_values: Callable[[], dict], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.form_values = form_values
        self.last_results: tuple[int, list[FitResult]] | None = None
        self.worker = FitWorker(self)
        self.worker.probe.connect(self._on_probe)
        self.worker.result.connect(self._add_result)
        self.worker.finished.connect(self._on_finished)
        self.worker.errored.connect(self._on_errored)
        self.budget = QLineEdit()
        self.budget.setPlaceholderText("e.g. 24GiB (empty on CUDA: the GPU's memory)")
        self.budget.textChanged.connect(self._validate)
        self.max_batch = QSpinBox()
        self.max_batch.setRange(1, 1_000_000)
        self.max_batch.setValue(1024)
        self.find_button = QPushButton("Find largest batch")
        self.find_button.clicked.connect(self.start_fit)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("End the search: the running probe is ended; the "
                                    "precisions already searched keep their results")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(self.stop_fit)
        self._budget_typed = ""  # the budget as typed when the search started
        self._searched: list[FitResult] = []  # results of this search so far
        # errors and statuses quote model names and precisions: never read as markup
        self.error_label = plain_label()
        self.error_label.setStyleSheet("color: #B00020")
        self.error_label.hide()
        self.status = plain_label("Uses the Run tab's model, precisions, sequence length and "
                                  "device. Each probe is a real training trial.")
        self.results = QTableWidget(0, len(RESULT_HEADERS))
        self.results.setHorizontalHeaderLabels(RESULT_HEADERS)
        self.cards = QTableWidget(0, len(CARD_HEADERS))
        self.cards.setHorizontalHeaderLabels(CARD_HEADERS)
        self.cards_note = QLabel("Will it fit on ...? PREDICTION from two measured batches, "
                                 "not a measurement")
        self.cards_note.setWordWrap(True)
        self.card_notes = QTableWidget(0, len(NOTE_HEADERS))
        self.card_notes.setHorizontalHeaderLabels(NOTE_HEADERS)
        self.card_notes.setWordWrap(True)
        for table in (self.results, self.cards, self.card_notes):
            table.verticalHeader().setVisible(False)
            table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
            table.horizontalHeader().setStretchLastSection(True)

        controls = QHBoxLayout()
        controls.addWidget(QLabel("Memory budget"))
        controls.addWidget(self.budget, 1)
        controls.addWidget(QLabel("Largest batch to try"))
        controls.addWidget(self.max_batch)
        controls.addWidget(self.find_button)
        controls.addWidget(self.stop_button)
        layout = QVBoxLayout(self)
        layout.addLayout(controls)
        layout.addWidget(self.error_label)
        layout.addWidget(self.status)
        layout.addWidget(self.results, 2)
        layout.addWidget(self.cards_note)
        layout.addWidget(self.cards, 1)
        layout.addWidget(self.card_notes, 1)

    def _validate(self, *_args) -> str | None:
        text = self.budget.text().strip()
        error = None
        if text:
            try:
                parse_bytes(text)
            except ValueError as exc:
                error = str(exc)
        self._show_error(error)
        return error

    def _show_error(self, error: str | None) -> None:
        self.error_label.setText(error or "")
        self.error_label.setVisible(error is not None)
        self.find_button.setEnabled(error is None and not self.worker.is_running())

    def config(self) -> FitConfig:
        """The search's config from this view and the Run form; ``ValueError`` if bad."""
        values = self.form_values()
        text = self.budget.text().strip()
        return FitConfig(model=values["model"], precisions=tuple(values["precisions"]),
                         seq_len=values["seq_len"],
                         memory_budget_bytes=parse_bytes(text) if text else None,
                         device=values["device"], max_batch=self.max_batch.value(),
                         optimizer=values["optimizer"], isolation=values["isolation"],
                         trust_remote_code=values["trust_remote_code"])

    def start_fit(self) -> bool:
        if self.worker.is_running():
            return False
        try:
            config = self.config()
        except ValueError as exc:
            self._show_error(str(exc))
            return False
        self._show_error(None)
        for table in (self.results, self.cards, self.card_notes):
            table.setRowCount(0)
        self._budget_typed = self.budget.text().strip()
        self._searched = []
        self.status.setText(f"Searching {', '.join(config.precisions)}…")
        self.worker.start(config)
        self.find_button.setEnabled(False)
        self.stop_button.setEnabled(True)
        return True

    def stop_fit(self) -> None:
        if self.worker.is_running():
            self.worker.stop()
            self.stop_button.setEnabled(False)
            self.status.setText("Stopping: the running probe is ended…")

    def _on_probe(self, precision: str, probe: FitProbe) -> None:
        verdict = "fits" if probe.fits else "does not fit"
        self.status.setText(f"{precision}: batch {probe.batch_size} {verdict} "
                            f"({_mib(probe.peak_bytes)})")

    def _on_errored(self, message: str) -> None:
        self.worker.join()
        self.stop_button.setEnabled(False)
        if message.startswith("stopped"):
            self.status.setText(f"Stopped: {len(self._searched)} precision(s) searched before the "
                                "stop are shown; the others were not searched.")
            self._show_error(None)
            return
        self.status.setText("The search did not run.")
        self._show_error(message.splitlines()[0])

    def _on_finished(self, budget: int, results: list[FitResult]) -> None:
        self.worker.join()
        self.stop_button.setEnabled(False)
        self.last_results = (budget, results)
        self._say_done(budget, results)
        self.find_button.setEnabled(True)

    def _say_done(self, budget: int, results: list[FitResult]) -> None:
        # the budget in the unit it was typed in; the GPU's memory (not typed) in GiB
        shown = budget_text(self._budget_typed) if self._budget_typed else (
            f"{budget / 2**30:.3g} GiB of 2^30 bytes (the GPU's memory)")
        context = ""
        if results and results[0].context_bytes is not None:
            context = (f" CUDA context {results[0].context_bytes / 2**20:.0f} MiB taken off "
                       f"it ({results[0].context_method}).")
        elif results and results[0].context_method.startswith("not measured"):
            context = f" CUDA context not taken off it: {results[0].context_method}."
        self.status.setText(f"Budget {shown}.{context} Memory: "
                            + "; ".join(sorted({r.memory_method for r in results})))

    def show_results(self, budget: int, results: list[FitResult]) -> None:
        """Show a finished search's results at once."""
        for table in (self.results, self.cards, self.card_notes):
            table.setRowCount(0)
        self._searched = []
        for r in results:
            self._add_result(r)
        self.last_results = (budget, results)
        self._say_done(budget, results)

    def _add_result(self, r: FitResult) -> None:
        """One precision's row in each table, as soon as its search ends."""
        self._searched.append(r)
        row = self.results.rowCount()
        for table in (self.results, self.cards, self.card_notes):
            table.insertRow(row)
        probes = " ".join(f"{p.batch_size}{'' if p.fits else '✗'}" for p in r.probes)
        cells = [
            _cell(r.precision),
            _cell(str(r.batch_size) if r.batch_size is not None else "n/a", r.reason or ""),
            _cell(_mib(r.memory_bytes), r.memory_method),
            _cell(_mib(r.predicted_bytes), "the memory model for the same batch"),
            _cell(f"{r.tokens_per_s:,.0f}" if r.tokens_per_s is not None else "n/a"),
            _cell(probes, "batch sizes tried, in order; ✗ = did not fit"),
            _cell(r.reason or ""),
        ]
        cells[0].setForeground(precision_color(r.precision))
        for col, item in enumerate(cells):
            self.results.setItem(row, col, item)
        self.cards.setItem(row, 0, _cell(r.precision))
        for col, card in enumerate(r.cards, start=1):
            text = str(card.max_batch) if card.max_batch is not None else "n/a"
            self.cards.setItem(row, col, _cell(text, r.cards_note))
        if not r.cards:
            for col in range(1, len(CARD_HEADERS)):
                self.cards.setItem(row, col, _cell("n/a", r.cards_note))
        self.card_notes.setItem(row, 0, _cell(r.precision))
        self.card_notes.setItem(row, 1, _cell(r.cards_note))
        self.card_notes.resizeRowsToContents()
        self.status.setText(f"{r.precision}: done ({len(self._searched)} searched)")

    def cell(self, table: QTableWidget, row: int, header: str) -> str:
        headers = {id(self.results): RESULT_HEADERS, id(self.cards): CARD_HEADERS,
                   id(self.card_notes): NOTE_HEADERS}[id(table)]
        return table.item(row, headers.index(header)).text()
