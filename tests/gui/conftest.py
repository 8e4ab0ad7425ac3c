"""GUI tests run offscreen, with settings and history in a temporary folder."""

import gc
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _private_app_dirs(tmp_path, monkeypatch):
    """Keep QSettings and the history database out of the user's real folders."""
    from PySide6.QtCore import QSettings

    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path / "data"))
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp_path / "cfg"))
    yield


@pytest.fixture(autouse=True)
def _device_probed_when_shown(qapp, monkeypatch):
    """The window probes its device in a thread once it has painted, and Run waits for the
    answer: a test acts, as a person would, once the window says what the device is."""
    from gui.main_window import MainWindow
    from tests.gui.clicks import pause

    real_show = MainWindow.show

    def show(self):
        real_show(self)
        for _ in range(15_000):  # generous: torch loads in the probe's thread
            if not self.config_panel.device_pending():
                return
            pause(20)

    monkeypatch.setattr(MainWindow, "show", show)
    yield


@pytest.fixture(autouse=True)
def _collect_windows_on_the_gui_thread():
    """A test's window and views are reference cycles: collect them here, on the GUI thread,
    after pytest-qt closed them. Left to the collector, they were destroyed in whichever thread
    next triggered a collection, the next test's device-probe thread once, and a QObject's
    destructor off the GUI thread waited for the GIL for ever (the suite hung)."""
    yield
    gc.collect()


@pytest.fixture(autouse=True)
def _no_mouse_button_left_held(qapp):
    """A test lets go of every mouse button it pressed: a button left held made every later
    test's pointer moves drags, and their hovers failed far from the cause."""
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication

    yield
    assert QGuiApplication.mouseButtons() == Qt.MouseButton.NoButton, (
        "this test left a mouse button held: end each press with its release "
        "(tests/gui/clicks.double_click)")
