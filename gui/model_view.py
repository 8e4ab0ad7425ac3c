"""What a trial's model held: every parameter's dtype and the module tree with bytes.

Quantised storage (bitsandbytes packs weights into int8 / uint8) and tied weights (one
parameter under two names, e.g. GPT-2's lm_head) are marked with a colour and a text
column, so they read in a screenshot and in a colour-blind eye alike.
"""

from __future__ import annotations

from PySide6.QtCore import QSortFilterProxyModel, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QStandardItem, QStandardItemModel
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QSplitter,
    QTableView,
    QTreeView,
    QVBoxLayout,
    QWidget,
)

from engine.core.events import ModuleInfo, ParamInfo, TrialResult
from engine.record.compare import format_bytes
from engine.record.run_record import RunRecord
from gui.plain_text import as_html, plain_label

QUANTIZED_DTYPES = ("int8", "uint8")  # how bitsandbytes stores quantised weights
QUANTIZED_BG = QColor("#E8DDF2")
TIED_BG = QColor("#FFF2CC")
SORT_ROLE = Qt.ItemDataRole.UserRole + 1
PARAM_HEADERS = ("Parameter", "dtype", "Shape", "Bytes", "Elements", "Trainable", "Module",
                 "Marks")
MODULE_HEADERS = ("Module", "Type", "Parameters", "Bytes", "Marks")
EMPTY_TEXT = ("No model yet. When a trial has loaded its model (Run tab), or when you open a "
              "report (File > Open) or a past run (History), every parameter with its dtype "
              "and the module tree with bytes appear here; quantised and tied weights are "
              "marked.")


def _item(text: str, sort_value=None) -> QStandardItem:
    item = QStandardItem(text)
    item.setEditable(False)
    item.setData(text if sort_value is None else sort_value, SORT_ROLE)
    if sort_value is not None and not isinstance(sort_value, str):
        item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    return item


def param_marks(p: ParamInfo) -> str:
    marks = []
    if p.dtype in QUANTIZED_DTYPES:
        marks.append("quantised")
    if p.tied_to:
        marks.append(f"tied to {p.tied_to}")
    return ", ".join(marks)


def _param_row(p: ParamInfo) -> list[QStandardItem]:
    row = [
        _item(p.name),
        _item(p.dtype),
        _item("×".join(map(str, p.shape)) or "scalar"),
        _item(format_bytes(p.bytes), p.bytes),
        _item(f"{p.numel:,}", p.numel),
        _item("yes" if p.trainable else "no"),
        _item(p.module_type),
        _item(param_marks(p)),
    ]
    background = TIED_BG if p.tied_to else QUANTIZED_BG if p.dtype in QUANTIZED_DTYPES else None
    for cell in row:
        if background is not None:
            cell.setBackground(QBrush(background))
    if p.tied_to:
        font = QFont()
        font.setItalic(True)
        row[0].setFont(font)
        row[0].setToolTip(as_html(
            f"shares its storage with {p.tied_to}: its bytes are counted once"))
    return row


def _module_row(m: ModuleInfo, tied: list[str]) -> list[QStandardItem]:
    """``tied``: "param -> shared with" notes for the weights this module holds directly."""
    marks = ((["quantised"] if m.quantized else [])
             + ([f"matmuls in {m.matmul_dtype}"] if m.matmul_dtype else []) + tied)
    row = [
        _item(m.name.rsplit(".", 1)[-1] or "(model)", m.name),
        _item(m.type),
        _item(f"{m.params:,}", m.params),
        _item(format_bytes(m.bytes), m.bytes),
        _item(", ".join(marks)),
    ]
    background = TIED_BG if tied else QUANTIZED_BG if m.quantized else None
    if background is not None:
        for cell in row:
            cell.setBackground(QBrush(background))
    row[0].setToolTip(as_html(m.name or "(model)"))
    return row


class ModelView(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.trials: list[TrialResult] = []
        self.trial_combo = QComboBox()
        self.trial_combo.currentIndexChanged.connect(self._show_selected)
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("Filter parameters (name, dtype, module…)")
        self.filter.setClearButtonEnabled(True)
        self.summary = plain_label(EMPTY_TEXT)

        self.params = QStandardItemModel(0, len(PARAM_HEADERS), self)
        self.params.setHorizontalHeaderLabels(PARAM_HEADERS)
        self.params_proxy = QSortFilterProxyModel(self)
        self.params_proxy.setSourceModel(self.params)
        self.params_proxy.setSortRole(SORT_ROLE)
        self.params_proxy.setFilterKeyColumn(-1)
        self.params_proxy.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        self.filter.textChanged.connect(self.params_proxy.setFilterFixedString)
        self.param_table = QTableView()
        self.param_table.setModel(self.params_proxy)
        self.param_table.setSortingEnabled(True)
        # model order until the user clicks a header
        self.param_table.horizontalHeader().setSortIndicator(-1, Qt.SortOrder.AscendingOrder)
        self.param_table.verticalHeader().hide()
        self.param_table.verticalHeader().setDefaultSectionSize(22)
        self.param_table.horizontalHeader().setSectionResizeMode(
            QHeaderView.ResizeMode.ResizeToContents)

        self.modules = QStandardItemModel(0, len(MODULE_HEADERS), self)
        self.modules.setHorizontalHeaderLabels(MODULE_HEADERS)
        self.tree = QTreeView()
        self.tree.setModel(self.modules)
        self.tree.header().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)

        top = QHBoxLayout()
        top.addWidget(QLabel("Trial"))
        top.addWidget(self.trial_combo)
        top.addWidget(self.filter, 1)
        legend = QLabel(
            f'<span style="background:{TIED_BG.name()}">&nbsp;tied weight&nbsp;</span> '
            f'<span style="background:{QUANTIZED_BG.name()}">&nbsp;quantised&nbsp;</span>')
        top.addWidget(legend)
        splitter = QSplitter()
        splitter.addWidget(self.param_table)
        splitter.addWidget(self.tree)
        splitter.setStretchFactor(0, 3)
        splitter.setStretchFactor(1, 2)
        splitter.setSizes([880, 500])
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.summary)
        layout.addWidget(splitter, 1)

    def show_record(self, record: RunRecord) -> None:
        self.show_trials([t for t in record.trials if t.dtype_map or t.module_tree])

    def show_trials(self, trials: list[TrialResult]) -> None:
        self.trials = trials
        self.trial_combo.blockSignals(True)
        self.trial_combo.clear()
        self.trial_combo.addItems([t.precision for t in trials])
        self.trial_combo.blockSignals(False)
        self._show_selected()

    def _show_selected(self) -> None:
        index = self.trial_combo.currentIndex()
        trial = self.trials[index] if 0 <= index < len(self.trials) else None
        self.params.removeRows(0, self.params.rowCount())
        self.modules.removeRows(0, self.modules.rowCount())
        if trial is None:
            self.summary.setText(EMPTY_TEXT)
            return
        footprint = ("n/a" if trial.load_footprint_bytes is None
                     else format_bytes(trial.load_footprint_bytes))
        self.summary.setText(
            f"{trial.precision}: {trial.param_count:,} parameters, "
            f"{trial.trainable_params:,} trainable; footprint after loading {footprint}"
            + (f" ({trial.footprint_note})" if trial.footprint_note else ""))
        tied: dict[str, list[str]] = {}
        for p in trial.dtype_map:
            self.params.appendRow(_param_row(p))
            if p.tied_to:
                owner, _, leaf = p.name.rpartition(".")
                tied.setdefault(owner, []).append(f"{leaf} tied to {p.tied_to}")
        self._fill_tree(trial.module_tree, tied)
        self.tree.expandToDepth(1)

    def _fill_tree(self, modules: list[ModuleInfo], tied: dict[str, list[str]]) -> None:
        # pre-order with depths: the parent of a node is the last node one level up
        parents: list[QStandardItem] = [self.modules.invisibleRootItem()]
        for m in modules:
            del parents[m.depth + 1:]
            row = _module_row(m, tied.get(m.name, []))
            parents[min(m.depth, len(parents) - 1)].appendRow(row)
            parents.append(row[0])
