"""Start the desktop window: ``python main.py`` with no arguments lands here."""

from __future__ import annotations

import sys

from PySide6.QtWidgets import QApplication

from gui import settings


def main(argv: list[str] | None = None) -> int:
    app = QApplication.instance() or QApplication(sys.argv if argv is None else argv)
    app.setOrganizationName(settings.ORGANISATION)
    app.setApplicationName(settings.APPLICATION)
    # imported after the QApplication exists: the window's modules build Qt objects
    from gui.main_window import MainWindow

    window = MainWindow()
    window.show()
    return app.exec()
