"""The Run form's optimizer-state list: ticking a state runs it beside each ticked recipe
as RECIPE+OPTIM, clicked as a person does."""

import pytest
from PySide6.QtCore import Qt

from gui.main_window import MainWindow
from tests.gui.clicks import RUN_TIMEOUT_MS, list_item, tick


@pytest.fixture
def panel(qtbot):
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    qtbot.waitUntil(lambda: not win.config_panel.device_pending(), timeout=RUN_TIMEOUT_MS)
    return win.config_panel


def _only(panel, names):
    for i in range(panel.precisions.count()):
        item = panel.precisions.item(i)
        if item.flags() & Qt.ItemFlag.ItemIsEnabled:  # greyed ones cannot be clicked
            tick(panel.precisions, item.text(), item.data(Qt.ItemDataRole.UserRole) in names)


def test_ticked_states_run_beside_each_ticked_recipe(panel):
    _only(panel, {"fp32", "bf16-amp"})
    assert panel.form_values()["precisions"] == ["fp32", "bf16-amp"]
    tick(panel.optim_states, "+adamw8bit")
    tick(panel.optim_states, "+adamw-bf16-sr")
    expected = ["fp32", "fp32+adamw8bit", "fp32+adamw-bf16-sr",
                "bf16-amp", "bf16-amp+adamw8bit", "bf16-amp+adamw-bf16-sr"]
    assert panel.form_values()["precisions"] == expected
    assert panel.config().precisions == tuple(expected)
    assert not panel.error_label.isVisible()
    # the state's tooltip says what it keeps, from the same text as the CLI's list
    assert "8-bit AdamW state" in list_item(panel.optim_states, "+adamw8bit").toolTip()
    # the plain recipe can be left out: only the state variants run
    tick(panel.optim_states, "(the run's optimizer)", False)
    assert panel.config().precisions == ("fp32+adamw8bit", "fp32+adamw-bf16-sr",
                                         "bf16-amp+adamw8bit", "bf16-amp+adamw-bf16-sr")


def test_no_state_ticked_is_an_inline_error(panel):
    _only(panel, {"fp32"})
    tick(panel.optim_states, "(the run's optimizer)", False)
    assert panel.error_label.isVisible() and "no precision given" in panel.error_label.text()


def test_saved_state_labels_tick_their_entries_again(panel, qtbot):
    _only(panel, {"bf16-amp"})
    tick(panel.optim_states, "+adamw4bit")
    saved = panel.saved_values()
    other = MainWindow()
    qtbot.addWidget(other)
    other.config_panel.set_values(saved)
    assert other.config_panel.form_values()["precisions"] == ["bf16-amp", "bf16-amp+adamw4bit"]
