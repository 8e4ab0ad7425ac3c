"""Strategy, ranks and reduce dtype in the configuration panel, set the way a user sets them."""

import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from gui.main_window import MainWindow
from tests.gui.clicks import wait_for_device


@pytest.fixture
def window(qtbot):
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    return win


def _choose(combo, text: str) -> None:
    """Pick an item by typing its first letters on the focused combo box."""
    combo.setFocus()
    QTest.keyClicks(combo, text)
    assert combo.currentText() == text


def _type_number(spin, value: int) -> None:
    spin.setFocus()
    QTest.keyClick(spin.lineEdit(), Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    QTest.keyClicks(spin.lineEdit(), str(value))
    QTest.keyClick(spin.lineEdit(), Qt.Key.Key_Return)


def test_ranks_without_a_strategy_show_the_fix_inline(window):
    panel = window.config_panel
    _type_number(panel.nproc, 2)
    assert not panel.error_label.isHidden()
    # in the form's words: the field's name, not the CLI flag
    assert 'set "Strategy" to ddp or fsdp2' in panel.error_label.text()
    assert not window.run_button.isEnabled()
    _choose(panel.strategy, "ddp")
    assert panel.error_label.isHidden() and window.run_button.isEnabled()


def test_strategy_ranks_and_reduce_dtype_make_the_config_and_persist(qtbot, window):
    panel = window.config_panel
    _choose(panel.strategy, "fsdp2")
    _type_number(panel.nproc, 4)
    _choose(panel.reduce_dtype, "bf16")
    config = panel.config()
    assert (config.strategy, config.nproc_per_node) == ("fsdp2", 4)
    assert all(p.endswith("@bf16") for p in config.precisions)
    window.close()

    second = MainWindow()
    qtbot.addWidget(second)
    second.show()  # the saved form comes back once the new window has probed its device
    wait_for_device(second.config_panel)
    again = second.config_panel.config()
    assert (again.strategy, again.nproc_per_node, again.precisions) == (
        "fsdp2", 4, config.precisions)
