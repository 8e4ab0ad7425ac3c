"""Driving the window as a person does: mouse clicks, typing, menu actions.

Dialogs are answered by the tests (monkeypatched ``QFileDialog`` / ``QMessageBox``
static calls); everything else goes through the widgets' own event handling.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QEvent, QEventLoop, QPoint, QPointF, Qt, QTimer
from PySide6.QtGui import QMouseEvent
from PySide6.QtTest import QTest
from PySide6.QtWidgets import (
    QAbstractButton,
    QApplication,
    QCheckBox,
    QComboBox,
    QListWidget,
    QTreeWidget,
    QWidget,
)

from engine.core.config import PRECISIONS, RunConfig

RUN_TIMEOUT_MS = 300_000  # generous: these wait for a real run, they do not time it


def pause(ms: int) -> None:
    """Let the window's events run for ``ms``. ``QTest.qWait`` keeps the GIL while it waits,
    so a thread of the window's (the device probe importing torch and transformers) ran at a
    fifth of its speed and a 60 s wait once ran out; an event loop lets threads run."""
    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def shown_window(qtbot):
    """The main window at a laptop's 1366 x 768, shown and exposed, closed with the test."""
    from gui.main_window import MainWindow

    win = MainWindow()
    qtbot.addWidget(win)
    win.resize(1366, 768)
    win.show()
    qtbot.waitExposed(win)
    return win


def click(widget: QAbstractButton) -> None:
    assert widget.isVisible() and widget.isEnabled(), f"{widget.text()!r} cannot be clicked"
    if isinstance(widget, QCheckBox):  # on its box: a stretched check box is blank on the right
        middle = widget.height() // 2
        QTest.mouseClick(widget, Qt.MouseButton.LeftButton, pos=QPoint(middle, middle))
    else:
        QTest.mouseClick(widget, Qt.MouseButton.LeftButton)


def hover(widget: QWidget, pos: QPoint) -> None:
    """The pointer moves onto ``pos`` of ``widget``, no button held: the move event is sent to
    the widget, as ``QTest.mouseClick`` sends a click's press and release. ``QTest.mouseMove``
    queues it through the window system instead, where something an earlier test in the same
    process left behind dropped every move (three hover tests failed in whole-suite runs,
    on CI too, and passed alone)."""
    event = QMouseEvent(QEvent.Type.MouseMove, QPointF(pos), QPointF(widget.mapToGlobal(pos)),
                        Qt.MouseButton.NoButton, Qt.MouseButton.NoButton,
                        Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, event)


def type_into(widget: QWidget, text: str) -> None:
    """Select what the field holds and type ``text`` over it."""
    widget.setFocus()
    QTest.keyClick(widget, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    QTest.keyClicks(widget, text)


def choose(combo: QComboBox, text: str) -> None:
    """Pick the entry ``text`` with the keyboard: Home, then Down until it is reached."""
    index = combo.findText(text)
    assert index >= 0, f"{text!r} is not offered"
    combo.setFocus()
    QTest.keyClick(combo, Qt.Key.Key_Home)
    for _ in range(index):
        QTest.keyClick(combo, Qt.Key.Key_Down)
    assert combo.currentText() == text, (combo.currentText(), text)


def list_item(items: QListWidget, name: str):
    """The entry named ``name``: its data (a precision marked "fp8 (emulated)") or its text."""
    found = [items.item(i) for i in range(items.count())
             if name in (items.item(i).data(Qt.ItemDataRole.UserRole), items.item(i).text())]
    assert len(found) == 1, (name, len(found))
    return found[0]


def tick(items: QListWidget, name: str, checked: bool = True) -> None:
    """Click a list entry, then press Space to toggle its check box when needed."""
    item = list_item(items, name)
    items.scrollToItem(item)
    QTest.mouseClick(items.viewport(), Qt.MouseButton.LeftButton,
                     pos=items.visualItemRect(item).center())
    if (item.checkState() == Qt.CheckState.Checked) != checked:
        QTest.keyClick(items, Qt.Key.Key_Space)
    assert (item.checkState() == Qt.CheckState.Checked) == checked, name


def click_tab(tabs, title: str) -> None:
    """Click a tab of a QTabWidget by its title, on its tab bar."""
    bar = tabs.tabBar()
    index = next(i for i in range(tabs.count()) if tabs.tabText(i).replace("&", "") == title)
    QTest.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(index).center())


def click_tree_item(tree: QTreeWidget, item, double: bool = False) -> None:
    tree.scrollToItem(item)
    rect = tree.visualItemRect(item)  # on its first characters: the row may be wider than the view
    pos = QPoint(rect.left() + min(rect.width() // 2, 30), rect.center().y())
    if double:
        double_click(tree.viewport(), pos)
    else:
        QTest.mouseClick(tree.viewport(), Qt.MouseButton.LeftButton, pos=pos)


def double_click(widget: QWidget, pos: QPoint) -> None:
    """A person's double click: a click, then the second press, the double click and the
    release. Qt 6's ``mouseDClick`` sends only the second press and the double click: the
    button stayed held for the rest of the process, and every later test's pointer moves
    were drags that never hovered anything (three hover tests failed on CI)."""
    QTest.mouseClick(widget, Qt.MouseButton.LeftButton, pos=pos)
    QTest.mouseDClick(widget, Qt.MouseButton.LeftButton, pos=pos)
    QTest.mouseRelease(widget, Qt.MouseButton.LeftButton, pos=pos)


def menu_action(window, *path: str):
    """The action at ``path`` in the menu bar, e.g. ("File", "Export run as", "JSON report…");
    matched without the ``&`` mnemonics."""
    def plain(text: str) -> str:
        return text.replace("&", "")

    actions = window.menuBar().actions()
    for depth, name in enumerate(path):
        action = next((a for a in actions if plain(a.text()) == name), None)
        assert action is not None, f"no menu entry {name!r} in {[a.text() for a in actions]}"
        if depth == len(path) - 1:
            return action
        actions = action.menu().actions()
    raise AssertionError(path)


def wait_for_device(panel, timeout_ms: int = 60_000) -> None:
    """Let the device probe (a thread) answer for the device chosen, as a person waits for
    "probing device…" to go away before pressing Run."""
    waited = 0
    while panel.device_pending() and waited < timeout_ms:
        pause(20)
        waited += 20
    assert not panel.device_pending(), "the device probe did not answer"


def fill_form(window, config: RunConfig) -> None:
    """Configure a run in the form through its widgets (preset models only)."""
    panel = window.config_panel
    choose(panel.source, "Preset")
    choose(panel.preset, config.model)
    for name in PRECISIONS:
        item = list_item(panel.precisions, name)
        if item.flags() & Qt.ItemFlag.ItemIsEnabled:
            tick(panel.precisions, name, name in config.precisions)
    type_into(panel.batch_size, str(config.batch_size))
    type_into(panel.seq_len, str(config.seq_len))
    type_into(panel.steps, str(config.steps))
    type_into(panel.warmup, str(config.warmup))
    choose(panel.device, config.device)
    choose(panel.isolation, config.isolation)
    wait_for_device(panel)
    made = panel.config()
    for key in ("model", "precisions", "batch_size", "seq_len", "steps", "warmup", "device",
                "isolation"):
        assert getattr(made, key) == getattr(config, key), key


def export(qtbot, window, path) -> Path:
    """Export the run on show through ``MainWindow.export_run`` and wait for the writer
    thread's answer: the path written."""
    with qtbot.waitSignal(window.exported, timeout=RUN_TIMEOUT_MS) as blocker:
        assert window.export_run(path)
    return Path(blocker.args[0])
