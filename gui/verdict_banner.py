"""The run's verdict on the Run tab, where the user watched the run: when it ends, however it
ends, its headline is on screen without finding the Compare tab, and "Details…" goes there.

The window stays on the tab the user is on: a run that ends never moves them.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from engine.record.run_record import RunRecord
from engine.record.verdict import verdict as recommend
from gui.plain_text import as_html

# as the Compare tab's verdict: green for a recommendation, amber when there is none
STYLES = {True: "background: #E8F5EC; border: 1px solid #9FD3B5;",
          False: "background: #FDF6E3; border: 1px solid #E8C77A;"}


def first_clause(headline: str) -> str:
    """The answer and the figures it rests on, up to the first "; " (a sweep's headline runs
    to seven lines at 1366 px, squeezing the charts below it); the rest is in the tooltip and
    one click away (Details…)."""
    return headline.split("; ", 1)[0]


def gist(headline: str) -> str:
    """The headline's answer, before its reasons: "Train in bf16-amp", "No recommendation"."""
    return headline.partition(":")[0]


class VerdictBanner(QFrame):
    details_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("verdictBanner")
        self.headline = QLabel()
        self.headline.setObjectName("verdictHeadline")
        self.headline.setTextFormat(Qt.TextFormat.PlainText)  # precision names, never markup
        self.headline.setWordWrap(True)
        self.headline.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.headline.setStyleSheet("font-size: 11pt; font-weight: 600;")
        self.reason = QLabel()  # the advice, or the first reason the verdict rests on
        self.reason.setTextFormat(Qt.TextFormat.PlainText)
        self.reason.setWordWrap(True)
        self.reason.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details = QPushButton("Details…")
        self.details.setToolTip("The comparison: every precision's figures and the reasons")
        self.details.clicked.connect(self.details_requested)
        text = QVBoxLayout()
        text.setSpacing(2)
        text.addWidget(self.headline)
        text.addWidget(self.reason)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 6)
        layout.addLayout(text, 1)
        layout.addWidget(self.details, 0, Qt.AlignmentFlag.AlignTop)
        self.hide()

    def show_record(self, record: RunRecord) -> str:
        """Show ``record``'s verdict; returns its headline."""
        v = recommend(record)
        self.headline.setText(first_clause(v.headline))
        first = f"To do: {v.advice}" if v.advice else next(iter(v.reasons), "")
        self.reason.setText(first)
        self.reason.setVisible(bool(first))
        self.setToolTip(as_html("\n".join([v.headline, *v.reasons, f"Rules: {v.rules}."])))
        self.setStyleSheet(f"QFrame#verdictBanner {{ {STYLES[v.precision is not None]} "
                           "border-radius: 4px; }")
        self.show()
        return v.headline
