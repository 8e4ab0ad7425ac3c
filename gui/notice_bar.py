"""Where a message that matters is shown whole: a wrapped bar above the tabs for a refusal
or an error (the status bar holds one line, shared with the device line), and the rule
that narrows the status bar's device line so that the message beside it is not cut."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QStatusBar, QToolButton, QWidget

STYLES = {"error": "background: #FDECEA; border: 1px solid #E0A39C;",
          "warning": "background: #FDF6E3; border: 1px solid #E8C77A;",
          "info": "background: #EAF2FB; border: 1px solid #9DBFE3;"}
MESSAGE_MARGIN_PX = 24  # the status bar's own margins and the size grip beside the message


class NoticeBar(QFrame):
    """A closable, word-wrapped line of plain text; hidden until there is something to say."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("notice")
        self.label = QLabel()
        self.label.setTextFormat(Qt.TextFormat.PlainText)  # paths and reasons, never markup
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.close_button = QToolButton()
        self.close_button.setText("✕")
        self.close_button.setToolTip("Hide this message (it stays in the Log tab)")
        self.close_button.setAutoRaise(True)
        self.close_button.clicked.connect(self.hide)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 4, 4, 4)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.close_button, 0, Qt.AlignmentFlag.AlignTop)
        self.level = "info"
        self.hide()

    def show_message(self, message: str, level: str = "error") -> None:
        self.level = level
        self.label.setText(message)
        self.setStyleSheet(f"QFrame#notice {{ {STYLES[level]} border-radius: 4px; }}")
        self.show()

    def text(self) -> str:
        return self.label.text() if self.isVisible() else ""


def fit_device_line(bar: QStatusBar, device_line: QWidget, others: list[QWidget]) -> None:
    """Narrow ``device_line`` (a permanent widget that elides itself) so that the bar's
    current message fits whole beside it and ``others``; no message: the line's full width."""
    message = bar.currentMessage()
    if not message:
        device_line.setMaximumWidth(16_777_215)
        return
    spacing = bar.layout().spacing() if bar.layout() else 6
    need = bar.fontMetrics().horizontalAdvance(message) + MESSAGE_MARGIN_PX
    shown = [w for w in others if w.isVisible()]
    if shown and bar.isVisible():  # the others stay right-aligned: the line ends before them
        end = min(w.geometry().left() for w in shown) - spacing
    else:
        end = bar.width() - sum(w.sizeHint().width() + spacing for w in shown)
    device_line.setMaximumWidth(max(0, end - need))
