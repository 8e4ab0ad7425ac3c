"""The H200's reports opened with File > Open at 1366 x 768: on the Run tab each chart keeps
a readable plot area (``MIN_PLOT_PX``), the charts scroll where they do not fit, and the
verdict and the Run button stay in view (see ``chart_room``)."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QApplication, QFileDialog

from gui.live_charts import MIN_PLOT_PX
from gui.main_window import MainWindow
from tests.engine.test_h200_reports import unpack
from tests.gui.chart_room import assert_charts_readable
from tests.gui.clicks import click_tab, menu_action, pause

REPORTS = ["01-gpt2-fp32_tf32_fp16-amp_bf16-amp_fp16_bf16.json",  # the six-precision sweep
           "03-gpt2-int8_nf4.json", "trace-run.json", "06-gpt2-fp32.json"]


@pytest.mark.parametrize("name", REPORTS)
def test_each_chart_of_an_h200_report_has_a_readable_plot_area(qtbot, monkeypatch, tmp_path,
                                                               name):
    window = MainWindow()
    qtbot.addWidget(window)
    window.resize(1366, 768)
    window.show()
    qtbot.waitExposed(window)
    path = unpack(name, tmp_path)
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(path), "")))
    with qtbot.waitSignal(window.record_shown, timeout=120_000):
        menu_action(window, "File", "Open report or journal…").trigger()
    click_tab(window.tabs, "Run")
    pause(200)  # layouts settle
    shown = assert_charts_readable(window)
    assert window.verdict_banner.isVisible()
    # measured independently of the helper: each view box's own height, in scene pixels
    heights = {key: window.charts.plots[key].getViewBox().sceneBoundingRect().height()
               for key in shown}
    assert min(heights.values()) >= MIN_PLOT_PX, heights
    assert {"memory", "monitor_gpm"} <= set(shown)  # a GPU run's charts, shown


def test_the_wheel_over_a_chart_scrolls_the_charts_and_leaves_its_range(qtbot, monkeypatch,
                                                                          tmp_path):
    window = MainWindow()
    qtbot.addWidget(window)
    window.resize(1366, 768)
    window.show()
    qtbot.waitExposed(window)
    path = unpack(REPORTS[0], tmp_path)
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(path), "")))
    with qtbot.waitSignal(window.record_shown, timeout=120_000):
        menu_action(window, "File", "Open report or journal…").trigger()
    click_tab(window.tabs, "Run")
    pause(200)
    charts = window.charts
    bar = charts.scroll.verticalScrollBar()
    assert bar.value() == 0 and bar.maximum() > 0
    box = charts.plots["loss"].getViewBox()
    before = box.viewRange()
    view = charts.layout_widget
    middle = view.mapFromScene(box.sceneBoundingRect().center())
    for _ in range(3):  # three notches down, the pointer over the loss chart's curves
        QApplication.sendEvent(view.viewport(), QWheelEvent(
            QPointF(middle), QPointF(view.viewport().mapToGlobal(middle)), QPoint(0, 0),
            QPoint(0, -120), Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier,
            Qt.ScrollPhase.NoScrollPhase, False))
        pause(20)
    assert bar.value() > 0  # the page moved
    # and the chart was not zoomed (a notch zooms by 1.35x; auto-range may move y by a hair)
    after = box.viewRange()
    assert after[0] == before[0]
    assert after[1][1] - after[1][0] == pytest.approx(before[1][1] - before[1][0], rel=1e-3)
