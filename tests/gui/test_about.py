"""Help > About lists the versions in use; a library outside the tested range is said once."""

from __future__ import annotations

import importlib.metadata
import platform
import sys

from PySide6.QtWidgets import QMessageBox

from gui.main_window import MainWindow
from tests.engine.test_versions import _fake_distribution
from tests.gui.clicks import menu_action


def _window(qtbot):
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    qtbot.waitExposed(win)
    return win


def test_about_lists_python_and_the_libraries_in_use(qtbot):
    win = _window(qtbot)
    menu_action(win, "Help", "About AmpScope…").trigger()
    box = win.findChild(QMessageBox, "about_box")
    assert box is not None and box.isVisible()
    text = box.informativeText()
    assert f"python {platform.python_version()}" in text
    for name in ("torch", "transformers", "PySide6-Essentials", "pyqtgraph"):
        assert f"{name} {importlib.metadata.version(name)} (tested " in text
    assert "OUTSIDE" not in text
    box.close()


def test_a_library_outside_the_range_is_said_once_in_the_window(qtbot, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", [str(_fake_distribution(tmp_path, "torch", "2.99.0")),
                                      *sys.path])
    win = _window(qtbot)
    message = win.statusBar().currentMessage()
    assert "torch 2.99.0 (tested 2.11-2.13; affects every measurement" in message
    assert win.log.toPlainText().count("torch 2.99.0") == 1  # said once
    menu_action(win, "Help", "About AmpScope…").trigger()
    box = win.findChild(QMessageBox, "about_box")
    assert "torch 2.99.0 (tested 2.11-2.13)  OUTSIDE" in box.informativeText()
    box.close()
