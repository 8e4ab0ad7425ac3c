"""The Run form on the CPU: mxfp8 and nvfp4 marked emulated (and tickable), as the gating
verdicts say."""

from PySide6.QtCore import Qt

from engine.measure import gating
from gui.main_window import MainWindow
from tests.gui.clicks import RUN_TIMEOUT_MS, list_item, tick


def test_block_scaled_recipes_are_marked_from_their_gating_verdicts(qtbot):
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    qtbot.waitUntil(lambda: not win.config_panel.device_pending(), timeout=RUN_TIMEOUT_MS)
    panel = win.config_panel
    mx = list_item(panel.precisions, "mxfp8")
    assert mx.text() == "mxfp8 (emulated)" and mx.font().italic()
    assert gating.verdict("mxfp8", gating.CPU).reason in mx.toolTip()
    tick(panel.precisions, "mxfp8")
    assert "mxfp8" in panel.config().precisions
    nv = list_item(panel.precisions, "nvfp4")
    assert nv.text() == "nvfp4 (emulated)" and nv.font().italic()
    assert nv.flags() & Qt.ItemFlag.ItemIsEnabled
    assert gating.verdict("nvfp4", gating.CPU).reason in nv.toolTip()
    tick(panel.precisions, "nvfp4")
    assert {"mxfp8", "nvfp4"} <= set(panel.config().precisions)
