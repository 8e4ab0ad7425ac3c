"""What the window loads before it is first shown: not torch (the device probe's thread
loads it), not pyqtgraph (the chart views are built after the first paint)."""

import subprocess
import sys
from pathlib import Path

from PySide6.QtWidgets import QMainWindow

from gui.chart_specs import USER_RUN_CHARTS
from gui.main_window import MainWindow
from tests.gui.clicks import click_tab, pause

ROOT = Path(__file__).resolve().parents[2]

BUILD_WINDOW = """
import sys
from PySide6.QtWidgets import QApplication
app = QApplication([])
from gui.main_window import MainWindow
window = MainWindow()
print(sorted(m for m in ("torch", "pyqtgraph", "numpy", "transformers") if m in sys.modules))
"""


def test_building_the_window_loads_neither_torch_nor_pyqtgraph(tmp_path):
    env = {**__import__("os").environ, "QT_QPA_PLATFORM": "offscreen",
           "AMPSCOPE_DATA_DIR": str(tmp_path / "data")}
    out = subprocess.run([sys.executable, "-c", BUILD_WINDOW], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_chart_views_are_built_after_the_first_paint(qtbot):
    window = MainWindow()
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.ready, timeout=60_000):
        window.show()
    titles = [window.tabs.tabText(i) for i in range(window.tabs.count())]
    assert window.tabs.widget(titles.index("Compare")) is window.compare_view
    assert window.tabs.widget(titles.index("Numerics")) is window.numerics_view
    assert window.charts.isVisible() and len(window.charts.plots) == 10 + len(USER_RUN_CHARTS)
    # a user's own run's charts (lr, grad norm, time split, scalars) wait hidden
    assert not any(window.charts.plots[key].isVisible() for key in USER_RUN_CHARTS)


def test_a_tab_clicked_before_its_view_is_built_shows_the_view(qtbot):
    window = MainWindow()
    qtbot.addWidget(window)
    QMainWindow.show(window)  # not conftest's show, which runs the event loop
    assert "numerics_view" not in window._built  # nothing painted yet: still a stand-in
    click_tab(window.tabs, "Numerics")
    pause(50)
    assert window.tabs.currentWidget() is window.numerics_view
    assert window.numerics_view.isVisible()
    assert window.numerics_view.run_button.isEnabled()


def test_start_up_objects_are_frozen_once_the_engine_has_loaded(qtbot):
    import gc

    gc.unfreeze()  # an earlier test's window may have frozen this process already
    window = MainWindow()
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.config_panel.engine_loaded, timeout=300_000):
        window.show()
    assert gc.get_freeze_count() > 0  # full collections no longer scan torch/transformers
