"""Would fp8 pay here? The payoff table (engine.measure.fp8_payoff) in the window, beside the
plan (Plan tab) and beside a run's comparison.

One card and recipe at a time, picked in a list that says each one's predicted step
speed-up: the verdict sentence, the filter to paste, and the Linear layers (grouped by leaf
name and shape) with each one's predicted speed-up, its measured one where ``main.py peak
--fp8-shapes`` timed that shape on that card (engine.measure.fp8_shape_timing), and why it
pays or does not. The table is built in a thread (it builds the model's skeleton), never in
the window's.
"""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QHeaderView,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from gui.plain_text import plain_label

PREDICTED = ("Would fp8 pay here? Predicted: each Linear layer's three training GEMMs "
             "(forward, grad-input, grad-weight) with their operands' casts against bf16, at "
             "M = tokens per micro-batch, by a model calibrated on torchao's published H100 "
             "tables and this project's H200 GPT-2 run. Measured: that shape's forward and "
             "backward timed in bf16 and fp8 on that card itself (main.py peak --fp8-shapes "
             "on it); a shape not timed there says predicted only.")
MEASURED = "Speed-up (measured)"
HEADERS = ("Layers", "M x K x N", "Speed-up (predicted)", MEASURED, "Pays?", "Why")


class PayoffWorker(QObject):
    """Runs one payoff computation in a thread; ``ready`` carries its generation, so a
    table asked for before the last one is dropped."""

    ready = Signal(int, object, object)  # generation, payoff dict, ":auto" trials
    failed = Signal(int, str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.generation = 0

    def start(self, compute, auto=()) -> None:
        self.generation += 1
        threading.Thread(target=self._run, args=(self.generation, compute, auto),
                         name="ampscope-payoff", daemon=True).start()

    def _run(self, generation: int, compute, auto) -> None:
        try:
            data = compute()
        except Exception as exc:  # noqa: BLE001 (shown in the view; the window stays up)
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            self.failed.emit(generation, f"n/a: the payoff table could not be built: {first}")
            return
        self.ready.emit(generation, data, list(auto))


def _cell(text: str, tooltip: str = "") -> QTableWidgetItem:
    item = QTableWidgetItem(text)
    item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEditable)
    item.setToolTip(tooltip or text)
    return item


def _measured(row: dict) -> str:
    """The measured column: the timed speed-up and the device it ran on, or "predicted"."""
    if row.get("measured_speedup") is None:
        return "n/a: predicted only"
    return f"x{row['measured_speedup']:.2f} on {row['measured_on']}"


def entry_title(card: str, label: str, entry: dict) -> str:
    """A list entry: the card, the recipe and its predicted step speed-up."""
    if "reason" in entry:
        return f"{card}: n/a"
    step = entry.get("step_speedup")
    step_text = "step n/a" if step is None else f"step x{step:.3f}"
    pays = sum(1 for r in entry["layers"] if r["pays"])
    return (f"{card} · {label}: {step_text} (predicted), {pays} of {len(entry['layers'])} "
            "layers pay")


class PayoffView(QWidget):
    finished = Signal()  # a table (or its reason) is shown

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.data: dict = {}
        self.worker = PayoffWorker(self)
        self.worker.ready.connect(self._on_ready)
        self.worker.failed.connect(self._on_failed)
        self.basis = plain_label(PREDICTED)
        self.basis.setStyleSheet("color: #555555")
        self.status = plain_label("Plan (or open a run) to see, layer by layer, whether fp8 "
                                  "would pay.")
        self.choice = QComboBox()
        self.choice.setToolTip("The card and recipe whose layers are listed below")
        self.choice.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.choice.currentIndexChanged.connect(self._show_entry)
        self.choice.hide()
        self.verdict = plain_label()
        self.verdict.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.filter = plain_label()  # the module_filter_fn to paste: selectable
        self.filter.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.filter.setStyleSheet("font-family: monospace")
        self.auto = plain_label()  # what each ':auto' trial converted (a run only)
        self.auto.hide()
        self.table = QTableWidget(0, len(HEADERS))
        self.table.setHorizontalHeaderLabels(HEADERS)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        self.table.verticalHeader().hide()
        # one line a row: the pane below Compare's charts holds a few more of them
        self.table.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 8)
        self.table.setWordWrap(False)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        for widget in (self.basis, self.status, self.choice, self.verdict,
                       self.filter, self.auto, self.table):
            layout.addWidget(widget)

    def wanted_height(self, rows: int = 6) -> int:
        """The height that shows the text whole and ``rows`` layer rows (Compare gives its
        lower pane this much when the tab is chosen)."""
        width = max(self.width(), 400)
        spacing = self.layout().spacing()
        shown = [w for w in (self.basis, self.status, self.choice, self.verdict, self.filter,
                             self.auto) if not w.isHidden()]
        text = sum(w.heightForWidth(width) if w.hasHeightForWidth() else w.sizeHint().height()
                   for w in shown)
        table = (rows * self.table.verticalHeader().defaultSectionSize()
                 + self.table.horizontalHeader().sizeHint().height()
                 + 2 * self.table.frameWidth())
        return text + table + spacing * len(shown)

    # --- asking -------------------------------------------------------------------------

    def show_plan(self, result, cards: tuple[str, ...]) -> None:
        """The plan's payoff per card asked, against its planned 16-bit step."""
        from engine.run.fp8_layers import plan_payoff

        self._ask(lambda: plan_payoff(result, cards))

    def show_record(self, record) -> None:
        """A run's payoff on the card it ran on, and what its ':auto' trials converted."""
        from engine.run.fp8_layers import report_payoff

        auto = [(t.precision, t.fp8_auto) for t in record.trials
                if getattr(t, "fp8_auto", None)]
        self._ask(lambda: report_payoff(record), auto)

    def clear(self, text: str) -> None:
        """Nothing shown but ``text`` (a new plan began): a table asked for before is
        dropped when it comes."""
        self.worker.generation += 1
        self.show_payoff({})
        self.status.setText(text)

    def _ask(self, compute, auto=()) -> None:
        self.status.setText("Building the payoff table…")
        self.status.show()
        self.worker.start(compute, auto)

    # --- showing ------------------------------------------------------------------------

    def _on_failed(self, generation: int, message: str) -> None:
        if generation == self.worker.generation:
            self.show_payoff({})
            self.status.setText(message)
            self.finished.emit()

    def _on_ready(self, generation: int, data: dict, auto: list) -> None:
        if generation == self.worker.generation:
            self.show_payoff(data, auto)
            self.finished.emit()

    def show_payoff(self, data: dict, auto=()) -> None:
        self.data = data
        self.choice.blockSignals(True)
        self.choice.clear()
        for card, recipes in data.items():
            if "reason" in recipes:
                self.choice.addItem(entry_title(card, "", recipes), (card, None))
                continue
            for label, entry in recipes.items():
                self.choice.addItem(entry_title(card, label, entry), (card, label))
        self.choice.blockSignals(False)
        self.choice.setVisible(self.choice.count() > 0)
        self.status.setText("" if data else "n/a: no card to weigh fp8 on (a plan names "
                            "cards; a run has one where it ran on a GPU)")
        self.status.setVisible(not data)
        self._show_auto(auto)
        self._show_entry(0 if self.choice.count() else -1)

    def _show_auto(self, auto) -> None:
        from engine.run.fp8_auto import note

        lines = [note(label, summary) for label, summary in auto]
        self.auto.setText("\n".join(lines))
        self.auto.setVisible(bool(lines))

    def _show_entry(self, index: int) -> None:
        from engine.run.fp8_layers import layer_groups, measured_text, module_filter

        self.table.setRowCount(0)
        self.verdict.clear()
        self.filter.clear()
        if index < 0:
            return
        card, label = self.choice.itemData(index)
        recipes = self.data[card]
        if label is None:
            self.verdict.setText(f"{card}: n/a: {recipes['reason']}")
            return
        entry = recipes[label]
        step = entry["step_speedup"]
        step_text = (f"step x{step:.3f} (predicted, against {entry['step_basis']})"
                     if step is not None else entry["step_basis"])
        self.verdict.setText(f"{entry.get('verdict', label)}\n{step_text}; "
                             f"{entry['calibration']} (spread ±{entry['spread']})")
        keep = entry["keep_bf16"]
        if keep and len(keep) < len(entry["layers"]):
            self.filter.setText("filter to paste: module_filter_fn="
                                + module_filter(keep, entry["layers"]))
        elif keep:
            self.filter.setText("no layer pays: keep this model in bf16")
        groups = layer_groups(entry["layers"])
        self.table.setRowCount(len(groups))
        for row, (name, r) in enumerate(groups):
            cells = (name, f"{r['m']} x {r['k']} x {r['n']}", f"x{r['speedup']:.2f}",
                     _measured(r), "pays" if r["pays"] else "does not pay", r["why"])
            for col, text in enumerate(cells):
                self.table.setItem(row, col, _cell(text, measured_text(r) if
                                                   HEADERS[col] == MEASURED else ""))

    def cell(self, row: int, header: str) -> str:
        return self.table.item(row, HEADERS.index(header)).text()
