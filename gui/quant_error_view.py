"""The Compare tab's quantisation error: one row per trial (median / worst-layer SQNR of
its weights and inputs, beside its loss vs fp32), its matmul layers below it."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QIcon, QPixmap
from PySide6.QtWidgets import QLabel, QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget

from engine.measure.quant_error_text import HEADERS, TITLE, layer_db, quant_rows
from engine.record.run_record import RunRecord
from gui.palette import precision_color

COLUMNS = ("precision / layer", "layers / rounded as", *HEADERS[2:])


class QuantErrorView(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.title = QLabel(TITLE + ". Expand a trial for its layers.")
        self.title.setWordWrap(True)
        self.tree = QTreeWidget()
        self.tree.setHeaderLabels(COLUMNS)
        self.tree.setUniformRowHeights(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.title)
        layout.addWidget(self.tree, 1)

    def show_record(self, record: RunRecord, loss_diffs: dict[str, float | None]) -> None:
        self.tree.clear()
        trials = {t.precision: t for t in record.trials}
        for row in quant_rows(record.trials, loss_diffs):
            item = QTreeWidgetItem(list(row))
            item.setIcon(0, _swatch(row[0]))
            if len(row) < len(HEADERS):  # n/a: the reason stands in the second column
                item.setToolTip(1, row[1])
            else:
                for col in range(2, len(HEADERS)):
                    item.setTextAlignment(col, Qt.AlignmentFlag.AlignRight)
                for layer in trials[row[0]].quant_error.layers:
                    child = QTreeWidgetItem([layer.name, layer.format,
                                             layer_db(layer, "weight"),
                                             layer_db(layer, "input"), ""])
                    for col in (2, 3):
                        child.setTextAlignment(col, Qt.AlignmentFlag.AlignRight)
                    item.addChild(child)
            self.tree.addTopLevelItem(item)
        for col in range(len(COLUMNS)):
            self.tree.resizeColumnToContents(col)


def _swatch(precision: str) -> QIcon:
    pixmap = QPixmap(10, 10)
    pixmap.fill(precision_color(precision))
    return QIcon(pixmap)
