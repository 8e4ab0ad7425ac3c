"""The Run form on the CPU: mxfp8 marked emulated (and tickable), nvfp4 greyed with its
n/a reason, as the gating verdicts say."""

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
    assert not nv.flags() & Qt.ItemFlag.ItemIsEnabled
    assert nv.checkState() == Qt.CheckState.Unchecked
    assert "nvfp4 cannot run here: n/a on the CPU" in nv.toolTip()
