"""The Fit view: the largest micro-batch per precision within a memory budget.

The model, precisions, sequence length, device and isolation come from the Run tab's
form; the budget and the search bound are asked for here. ``FitWorker`` runs
``engine.fit.run_fit`` in a thread (each probe a real trial in a child process) and
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

from engine.fit import CARDS, FitConfig, FitProbe, FitResult, parse_bytes
from gui.palette import precision_color
from gui.plain_text import plain_label

RESULT_HEADERS = ("Precision", "Batch", "Memory", "Predicted", "Tokens/s", "Probes", "Note")
# each card by the capacity CUDA reports, in GiB of 2^30 bytes (not its nominal GB)
CARD_HEADERS = ("Precision", *[c.header for c in CARDS])


class FitWorker(QObject):
    """Runs the batch search in a thread; probes and results come back as signals."""

    probe = Signal(str, object)  # precision, FitProbe
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
        from engine.fit import FitCancelled, run_fit

        try:
            budget, results = run_fit(config, self.probe.emit, self._stop.is_set)
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
        self.cards_note = QLabel("Will it fit on ...? (a prediction from two measured batches)")
        self.cards_note.setWordWrap(True)
        for table in (self.results, self.cards):
            table.verticalHeader().setVisible(False)
            table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
            table.horizontalHeader().setStretchLastSection(True)

        controls = QHBoxLayout()
        controls.addWidget(QLabel("Memory budget"))
        controls.addWidget(self.budget, 1)
        controls.addWidget(QLabel("Largest batch to try"))
        controls.addWidget(self.max_batch)
        controls.addWidget(self.find_button)
        layout = QVBoxLayout(self)
        layout.addLayout(controls)
        layout.addWidget(self.error_label)
        layout.addWidget(self.status)
        layout.addWidget(self.results, 2)
        layout.addWidget(self.cards_note)
        layout.addWidget(self.cards, 1)

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
        self.results.setRowCount(0)
        self.cards.setRowCount(0)
        self._probes: dict[str, list[FitProbe]] = {}
        self.status.setText(f"Searching {', '.join(config.precisions)}…")
        self.worker.start(config)
        self.find_button.setEnabled(False)
        return True

    def _on_probe(self, precision: str, probe: FitProbe) -> None:
        verdict = "fits" if probe.fits else "does not fit"
        self.status.setText(f"{precision}: batch {probe.batch_size} {verdict} "
                            f"({_mib(probe.peak_bytes)})")

    def _on_errored(self, message: str) -> None:
        self.worker.join()
        self.status.setText("The search did not run.")
        self._show_error(message.splitlines()[0])

    def _on_finished(self, budget: int, results: list[FitResult]) -> None:
        self.worker.join()
        self.show_results(budget, results)
        self.find_button.setEnabled(True)

    def show_results(self, budget: int, results: list[FitResult]) -> None:
        self.last_results = (budget, results)
        context = ""
        if results and results[0].context_bytes is not None:
            context = (f" CUDA context {results[0].context_bytes / 2**20:.0f} MiB taken off "
                       f"it ({results[0].context_method}).")
        elif results and results[0].context_method.startswith("not measured"):
            context = f" CUDA context not taken off it: {results[0].context_method}."
        self.status.setText(f"Budget {budget / 2**30:.3g} GiB (2^30 bytes).{context} Memory: "
                            + "; ".join(sorted({r.memory_method for r in results})))
        self.results.setRowCount(len(results))
        self.cards.setRowCount(len(results))
        notes = []
        for row, r in enumerate(results):
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
            notes.append(f"{r.precision}: {r.cards_note}")
        self.cards_note.setText("Will it fit on ...? PREDICTION, not a measurement. "
                                + " ".join(notes))

    def cell(self, table: QTableWidget, row: int, header: str) -> str:
        headers = RESULT_HEADERS if table is self.results else CARD_HEADERS
        return table.item(row, headers.index(header)).text()
