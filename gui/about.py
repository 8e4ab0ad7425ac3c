"""Help > About: AmpScope's version and the versions it runs with, against the tested range."""

from __future__ import annotations

from PySide6.QtWidgets import QMessageBox

from engine.core.versions import report, warning_line


def show_about(window) -> QMessageBox:
    """Open the About box (window-modal, not blocking the event loop) and return it."""
    box = QMessageBox(window)
    box.setObjectName("about_box")
    box.setWindowTitle("About AmpScope")
    box.setIcon(QMessageBox.Icon.Information)
    box.setText("AmpScope: a profiler for mixed-precision training")
    outside = warning_line()
    box.setInformativeText(report() + (f"\n\n{outside}" if outside else ""))
    box.open()
    return box
