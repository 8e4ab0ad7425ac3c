"""Save one chart as PNG (pyqtgraph's ImageExporter) or SVG (Qt's QSvgGenerator).

pyqtgraph 0.14's SVGExporter cannot parse the close-path command ("Z") that Qt 6
writes into SVG paths and raises on every plot (pyqtgraph issue #3485), so the SVG is
drawn by Qt itself from the chart's area of the scene.
"""

from __future__ import annotations

from pathlib import Path

import pyqtgraph as pg
import pyqtgraph.exporters as pg_exporters
from PySide6.QtCore import QRectF
from PySide6.QtGui import QGuiApplication, QPainter
from PySide6.QtSvg import QSvgGenerator


def export_chart(plot: pg.PlotItem, path: str | Path) -> Path:
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".png":
        pg_exporters.ImageExporter(plot).export(str(path))
    elif suffix == ".svg":
        _write_svg(plot, path)
    else:
        raise ValueError(f"unknown image extension '{suffix or '(none)'}': use .png or .svg")
    return path


def _write_svg(plot: pg.PlotItem, path: Path) -> None:
    source = plot.sceneBoundingRect()
    target = QRectF(0, 0, source.width(), source.height())
    generator = QSvgGenerator()
    generator.setFileName(str(path))
    generator.setSize(target.size().toSize())
    generator.setViewBox(target)
    # axes replay QPictures recorded at the screen's DPI: draw at the same DPI or they shrink
    generator.setResolution(round(QGuiApplication.primaryScreen().logicalDotsPerInch()))
    generator.setTitle(plot.titleLabel.text or "AmpScope chart")
    painter = QPainter(generator)
    try:
        painter.fillRect(target, pg.mkColor(pg.getConfigOption("background")))
        plot.scene().render(painter, target, source)
    finally:
        painter.end()
