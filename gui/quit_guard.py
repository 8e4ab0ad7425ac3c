"""Quitting while a run is in progress asks first: closing stops the run, and the trials not
finished by then are lost. Asked for the user's own ways out (the window's close button,
File > Quit); a program that closes the window itself (tests, scripts) is not asked."""

from __future__ import annotations

from PySide6.QtWidgets import QMessageBox

TITLE = "Quit during a run?"
QUESTION = ("A run is in progress. Quitting stops it: the trial under way and those not "
            "started yet are not measured, and the run is not saved to the history.")
STOP_AND_QUIT = "Stop the run and quit"
KEEP_RUNNING = "Keep running"


def may_quit(window) -> bool:
    """True when the window may close: no run in progress, or the user chose to stop it."""
    if not window.worker.is_running():
        return True
    box = QMessageBox(QMessageBox.Icon.Question, TITLE, QUESTION, parent=window)
    stop = box.addButton(STOP_AND_QUIT, QMessageBox.ButtonRole.AcceptRole)
    keep = box.addButton(KEEP_RUNNING, QMessageBox.ButtonRole.RejectRole)
    box.setDefaultButton(keep)
    box.setEscapeButton(keep)
    box.exec()
    return box.clickedButton() is stop


def quit_asked(window) -> None:
    """File > Quit: close once the user agreed (the close itself then asks no more)."""
    if may_quit(window):
        window.close()
