"""The window on a 1366x768 laptop screen, and what empty tabs tell a new user."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QRectF

from gui.main_window import MainWindow
from tests.gui.chart_room import assert_charts_readable

# 1366x768 is the whole screen; a title bar and a panel take ~70 px of its height
SIZES = [(1366, 768), (1366, 698)]
MIN_CHART = (200, 100)  # px: narrower or lower than this and a chart stops being readable


@pytest.fixture
def window(qtbot):
    win = MainWindow()
    qtbot.addWidget(win)
    return win


def _fully_visible(widget) -> bool:
    return widget.isVisible() and widget.visibleRegion().boundingRect().size() == widget.size()


def _charts_fit(view, plots) -> None:
    """Every plot lies inside its graphics view, at a readable size, and the view is not
    clipped by the window."""
    assert _fully_visible(view.viewport())
    # plots share a view's width in thirds of a pixel: half a pixel of float rounding
    bounds = QRectF(view.viewport().rect()).adjusted(-0.5, -0.5, 0.5, 0.5)
    for key, plot in plots.items():
        if not plot.isVisible():  # a user run's charts, hidden for a profile run
            continue
        rect = plot.sceneBoundingRect()
        assert bounds.contains(rect), (key, rect, bounds)
        assert rect.width() >= MIN_CHART[0] and rect.height() >= MIN_CHART[1], (key, rect)


@pytest.mark.parametrize("size", SIZES)
def test_the_window_fits_a_1366x768_screen(qtbot, window, size):
    window.resize(*size)
    window.show()
    qtbot.waitExposed(window)
    assert (window.width(), window.height()) == size  # nothing forces it larger
    for tab in range(window.tabs.count()):
        hint = window.tabs.widget(tab).minimumSizeHint()
        assert hint.width() <= size[0] and hint.height() <= size[1] - 100
    # Run and Stop never scroll away with the form
    assert _fully_visible(window.run_button) and _fully_visible(window.stop_button)
    assert_charts_readable(window)  # the Run tab's charts scroll where they do not fit
    window.tabs.setCurrentWidget(window.compare_view)
    qtbot.wait(50)
    _charts_fit(window.compare_view.charts, window.compare_view.plots)
    window.tabs.setCurrentWidget(window.numerics_view)
    qtbot.wait(50)
    _charts_fit(window.numerics_view.charts, {"histogram": window.numerics_view.histogram})


def test_first_start_uses_at_most_the_screens_free_area(qtbot, window):
    free = window.screen().availableGeometry()
    assert window.width() <= free.width() and window.height() <= free.height()


def test_empty_tabs_say_what_will_appear_and_how(qtbot, window):
    window.show()
    compare = window.compare_view.note.text()
    assert compare.startswith("Nothing to compare yet") and "File > Open" in compare
    assert "History" in compare and "Run tab" in compare
    model = window.model_view.summary.text()
    assert model.startswith("No model yet") and "dtype" in model
    window.tabs.setCurrentWidget(window.history_view)
    assert window.history_view.empty.isVisible()
    assert window.history_view.empty.text().startswith("No runs yet")
    numerics = window.numerics_view.status.text()
    assert numerics.startswith("No numerics yet") and '"Run numerics lab"' in numerics
    assert window.numerics_view.histogram.getAxis("left").labelText == "count"
