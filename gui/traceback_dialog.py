"""The full traceback of a trial that raised: its one-line reason on top, the text as Python
printed it below (monospace, not wrapped, selectable), and a button that copies it for a bug
report. Plain text throughout: a traceback quotes the user's code and messages."""

from __future__ import annotations

from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QPlainTextEdit, QVBoxLayout

from gui.plain_text import plain_label


class TracebackDialog(QDialog):
    def __init__(self, precision: str, reason: str | None, text: str, parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"Traceback of {precision}")
        self.resize(900, 520)
        layout = QVBoxLayout(self)
        layout.addWidget(plain_label(reason or ""))
        self.text = QPlainTextEdit(text)
        self.text.setReadOnly(True)
        self.text.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.text.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        layout.addWidget(self.text)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.copy_button = buttons.addButton("Copy", QDialogButtonBox.ButtonRole.ActionRole)
        self.copy_button.clicked.connect(lambda: QGuiApplication.clipboard().setText(text))
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
