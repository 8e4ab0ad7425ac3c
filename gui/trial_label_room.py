"""Room at the top of a monitor chart for the names of the trials that began on it.

The names sit beside the trials' start lines, in a band of ``ROWS`` rows at the top of the
chart; the y range is raised so that the curves stay below the band, whatever the chart's
height. They were placed at fixed fractions of the height, where the host CPU trace also
runs (near 100 %), and overprinted it. A name goes in the first row where it overprints no
other name; one that finds no room is left out (its line's colour names it in the legend).
"""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import QPointF
from PySide6.QtGui import QFont

ROWS = 2  # the host chart is about 70 px tall at 1366 x 768: two rows leave the trace half
RIGHT, LEFT = (0.0, 1.0), (1.0, 1.0)  # a name right of its line, or left near the right edge
FONT_PT = 8
MARGIN_PX = 1  # above the first row
GAP_PX = 4  # between names in a row, and between the last row and the curves' top


class TrialLabelRoom:
    def __init__(self, plot: pg.PlotItem) -> None:
        self.plot = plot
        self.labelled: list[tuple[pg.InfiniteLine, int]] = []  # (line, row)
        self._top = 0.0  # the curves' highest value
        self._x = 0.0  # where they reach it
        # invisible but counted by the auto-range: the top of the y range, above the curves
        self._ceiling = pg.PlotCurveItem([], [], pen=pg.mkPen((0, 0, 0, 0)))
        plot.addItem(self._ceiling)
        box = plot.getViewBox()
        box.sigResized.connect(lambda *_: self.fit())
        box.sigXRangeChanged.connect(lambda *_: self.fit())

    def label_opts(self, color) -> dict:
        return {"position": 0.95, "color": color, "anchors": [RIGHT, RIGHT]}

    def add(self, line: pg.InfiniteLine) -> None:
        font = QFont(line.label.textItem.font())
        font.setPointSize(FONT_PT)
        line.label.setFont(font)
        self.labelled.append((line, 0))
        self.fit()

    def clear(self) -> None:
        self.labelled.clear()
        self._top = 0.0
        self._ceiling.setData([], [])

    def set_top(self, top: float, x: float) -> None:
        """The curves reach ``top`` (at ``x``): keep the y range's top above the band."""
        self._top = max(self._top, top)
        self._x = x
        self.fit()

    def row_px(self) -> float:
        """A name's height on screen (its text item's, margins included)."""
        if not self.labelled:
            return 0.0
        return self.labelled[0][0].label.boundingRect().height()

    def band_px(self) -> float:
        return ROWS * self.row_px() + MARGIN_PX + GAP_PX if self.labelled else 0.0

    def fit(self) -> None:
        box = self.plot.getViewBox()
        height = box.height()
        if height <= 0:
            return
        self._place(box, height)
        if self._top <= 0 or not self.labelled:
            self._ceiling.setData([], [])
            return
        share = max(0.3, 1 - self.band_px() / height)  # the curves' share of the height
        self._ceiling.setData([self._x, self._x], [0.0, self._top / share])  # from 0

    def _place(self, box, height: float) -> None:
        """Each name in the first row it fits in, left to right; left out where none has room."""
        right_edge = box.sceneBoundingRect().right()
        ends = [float("-inf")] * ROWS  # per row, where its last name ends (scene x)
        placed = []
        for line, _ in sorted(self.labelled, key=lambda item: item[0].value()):
            label = line.label
            x = box.mapViewToScene(QPointF(line.value(), 0)).x()
            width = label.boundingRect().width()
            anchor = RIGHT if x + width <= right_edge else LEFT
            left = x if anchor == RIGHT else x - width
            row = next((r for r in range(ROWS) if ends[r] + GAP_PX <= left), None)
            label.setVisible(row is not None)
            if row is None:
                placed.append((line, 0))
                continue
            ends[row] = left + width
            label.anchors = [anchor, anchor]
            label.setPosition(max(0.0, 1 - ((row + 1) * self.row_px() + MARGIN_PX) / height))
            placed.append((line, row))
        self.labelled = placed
