"""Start the desktop window: ``python main.py`` with no arguments lands here."""

from __future__ import annotations

import ctypes.util
import os
import sys

from PySide6.QtWidgets import QApplication

from gui import settings


def screen_problem(environ=os.environ, platform: str = sys.platform,
                   find_library=ctypes.util.find_library) -> str | None:
    """Why Qt could not open a window here, said before Qt aborts the process; None if fine."""
    if not platform.startswith("linux") or environ.get("QT_QPA_PLATFORM"):
        return None
    if not environ.get("DISPLAY") and not environ.get("WAYLAND_DISPLAY"):
        return ("no screen found (neither DISPLAY nor WAYLAND_DISPLAY is set): on a server use "
                "the headless commands ('python main.py --help') and open their JSON report "
                "in the app on a desktop")
    if not environ.get("WAYLAND_DISPLAY") and find_library("xcb-cursor") is None:
        return ("Qt needs the X11 library libxcb-cursor0 to open a window: install it "
                "(for example 'sudo apt-get install libxcb-cursor0') and start again")
    return None


def main(argv: list[str] | None = None) -> int:
    problem = screen_problem()
    if problem:
        print(f"ampscope: error: {problem}", file=sys.stderr)
        return 2
    app = QApplication.instance() or QApplication(sys.argv if argv is None else argv)
    app.setOrganizationName(settings.ORGANISATION)
    app.setApplicationName(settings.APPLICATION)
    # imported after the QApplication exists: the window's modules build Qt objects
    from gui.main_window import MainWindow
    from gui.signals import close_on_signals

    window = MainWindow()
    window.show()
    close_on_signals(window)
    return app.exec()
