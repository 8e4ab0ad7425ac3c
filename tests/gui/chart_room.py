"""The Run tab's charts as a person reads them at 1366 x 768: each plot area (the view box,
inside its title and axes) at least ``MIN_PLOT_PX`` high, every chart brought whole into
view by dragging the charts' scroll bar, each title and axis label inside its own chart and
over no plot area, and the verdict banner and the Run button in view wherever the charts
are scrolled to."""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect, QRectF

from gui.live_charts import MIN_PLOT_PX


def fully_visible(widget) -> bool:
    return widget.isVisible() and widget.visibleRegion().boundingRect().size() == widget.size()


def _on_screen(charts) -> QRectF:
    """The part of the charts' scene the scroll area shows now."""
    view, screen = charts.layout_widget, charts.scroll.viewport()
    top_left = view.viewport().mapFrom(screen, QPoint(0, 0))
    shown = view.mapToScene(QRect(top_left, screen.size())).boundingRect()
    return shown.adjusted(-1, -1, 1, 1)  # a pixel of rounding


def _text_rect(label) -> QRectF:
    """A text item's lines, without the blank margin its document keeps around them."""
    margin = label.document().documentMargin()
    return label.mapRectToScene(label.boundingRect().adjusted(margin, margin, -margin, -margin))


def assert_charts_readable(window) -> list[str]:
    """Checks the shown charts as said above; returns their keys."""
    charts = window.charts
    shown = charts.visible_charts()
    assert shown
    canvas = QRectF(charts.layout_widget.viewport().rect()).adjusted(-0.5, -0.5, 0.5, 0.5)
    areas = {key: charts.plots[key].getViewBox().sceneBoundingRect() for key in shown}
    for key in shown:
        plot = charts.plots[key]
        box = plot.sceneBoundingRect()
        assert areas[key].height() >= MIN_PLOT_PX, (key, areas[key])
        assert box.width() >= 240, (key, box)  # three columns at 1366 px, not squeezed
        assert canvas.contains(box), (key, box, canvas)  # nothing cut off the canvas
        inside = box.adjusted(-1, -1, 1, 1)
        labels = {"title": plot.titleLabel.item, "x label": plot.getAxis("bottom").label,
                  "y label": plot.getAxis("left").label}
        for name, label in labels.items():
            if not label.isVisible():
                continue
            rect = _text_rect(label)
            assert inside.contains(rect), (key, name, rect, box)
            for other, area in areas.items():  # over no curve's room, its own or another's
                assert not rect.intersects(area), (key, name, other, rect, area)
    # the charts stay apart: no two overlap
    boxes = [charts.plots[key].sceneBoundingRect().adjusted(1, 1, -1, -1) for key in shown]
    for i, box in enumerate(boxes):
        assert not any(box.intersects(other) for other in boxes[i + 1:]), shown[i]

    # drag the scroll bar top to bottom, a page at a time: each plot area is seen whole
    bar = charts.scroll.verticalScrollBar()
    seen: set[str] = set()
    for value in [*range(bar.minimum(), bar.maximum(), bar.pageStep()), bar.maximum()]:
        bar.setValue(value)
        screen = _on_screen(charts)
        seen |= {key for key in shown if screen.contains(areas[key])}
        assert fully_visible(window.run_button)
        assert not window.verdict_banner.isVisible() or fully_visible(window.verdict_banner)
    bar.setValue(bar.minimum())
    assert seen == set(shown), set(shown) - seen
    return shown
