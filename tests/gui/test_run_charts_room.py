"""The H200's reports opened with File > Open at 1366 x 768: on the Run tab each chart keeps
a readable plot area (``MIN_PLOT_PX``), the charts scroll where they do not fit, and the
verdict and the Run button stay in view (see ``chart_room``)."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QFileDialog

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
