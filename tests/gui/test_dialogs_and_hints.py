"""File dialogs open in the user's documents folder (even before it exists), with no file
name pre-filled by Open; a precision's hint says what runs on this device (emulated fp8
runs uncompiled, so its hint does not say "compiled")."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QFileDialog, QLineEdit

from gui.main_window import MainWindow
from tests.gui.clicks import list_item, menu_action


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch):
    home = tmp_path / "home"  # a new user's home: no Documents folder yet
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_DOCUMENTS_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # started from the checkout
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    qtbot.waitExposed(win)
    return win


def _dialog_seen(qtbot, action) -> dict:
    """Trigger ``action``, read the file dialog it opens as a person would see it, cancel."""
    seen = {}

    def read() -> None:
        dialog = QApplication.activeModalWidget()
        if not isinstance(dialog, QFileDialog):
            QTimer.singleShot(20, read)
            return
        name = dialog.findChild(QLineEdit, "fileNameEdit")
        seen.update(folder=dialog.directory().absolutePath(), name=name.text())
        dialog.reject()

    QTimer.singleShot(20, read)
    action.trigger()
    qtbot.waitUntil(lambda: bool(seen), timeout=10_000)
    return seen


def test_open_and_export_dialogs_open_in_the_documents_folder(qtbot, window, tmp_path):
    documents = tmp_path / "home" / "Documents"
    opened = _dialog_seen(qtbot, menu_action(window, "File", "Open report or journal…"))
    assert opened == {"folder": str(documents), "name": ""}
    window.record = None  # Export names its file after the run on show: none here
    exported = _dialog_seen(qtbot, menu_action(window, "File", "Export run as", "JSON report…"))
    assert exported == {"folder": str(documents), "name": "ampscope-run.json"}


def test_emulated_fp8_does_not_claim_to_be_compiled(window):
    info = window.config_panel.device_info
    verdict = info.verdict("fp8")
    if verdict is None or verdict.support != "emulated":
        pytest.skip("fp8 runs natively here")
    item = list_item(window.config_panel.precisions, "fp8")
    assert item.text() == "fp8 (emulated)"
    hint = item.toolTip()
    assert "compiled" not in hint.replace("uncompiled", ""), hint  # not even "compiled"
    assert "runs uncompiled here" in hint
    # the help line under the list says the same when the entry is clicked
    items = window.config_panel.precisions
    items.scrollToItem(item)
    QTest.mouseClick(items.viewport(), Qt.MouseButton.LeftButton,
                     pos=items.visualItemRect(item).center())
    assert window.config_panel.precision_help.text() == hint
