"""The comparison table model: ``engine.record.compare`` rows with its columns and formats.

Sorting uses the raw values (n/a sorts last), display uses ``format_cell``, so the
window, the CLI and the reports show the same text.
"""

from __future__ import annotations

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QSortFilterProxyModel, Qt
from PySide6.QtGui import QColor

from engine.record.compare import COLUMNS, ComparisonRow, format_cell
from gui.palette import precision_color
from gui.plain_text import as_html

RAW_ROLE = Qt.ItemDataRole.UserRole
_ROOT = QModelIndex()


class ComparisonModel(QAbstractTableModel):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.rows: list[ComparisonRow] = []

    def set_rows(self, rows: list[ComparisonRow]) -> None:
        self.beginResetModel()
        self.rows = list(rows)
        self.endResetModel()

    def rowCount(self, parent=_ROOT) -> int:
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent=_ROOT) -> int:
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section, orientation, role=Qt.ItemDataRole.DisplayRole):
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section][1]
        return None

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        row = self.rows[index.row()]
        key = COLUMNS[index.column()][0]
        value = getattr(row, key)
        if role == Qt.ItemDataRole.DisplayRole:
            return format_cell(key, value)
        if role == RAW_ROLE:
            return value
        if role == Qt.ItemDataRole.DecorationRole and key == "precision":
            return precision_color(row.precision)
        if role == Qt.ItemDataRole.ForegroundRole and key == "status" and row.status != "ok":
            return QColor("#C00000")
        if role == Qt.ItemDataRole.ToolTipRole and row.reason:
            return as_html(row.reason)
        if role == Qt.ItemDataRole.TextAlignmentRole and key not in ("precision", "status",
                                                                     "reason"):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None


class RawValueSortProxy(QSortFilterProxyModel):
    """Sorts by the raw value; None (n/a) always after the numbers."""

    def lessThan(self, left, right) -> bool:
        a, b = left.data(RAW_ROLE), right.data(RAW_ROLE)
        if a is None or b is None:
            # n/a last in ascending order
            return a is not None and b is None
        if isinstance(a, str) or isinstance(b, str):
            return str(a) < str(b)
        return a < b


def table_as_tsv(model) -> str:
    """The table as shown (sorted, formatted), with a header line, tab-separated."""
    columns = range(model.columnCount())
    lines = ["\t".join(model.headerData(c, Qt.Orientation.Horizontal) for c in columns)]
    for r in range(model.rowCount()):
        cells = (model.index(r, c).data() or "" for c in columns)
        lines.append("\t".join(cell.replace("\t", " ").replace("\n", " ") for cell in cells))
    return "\n".join(lines) + "\n"
