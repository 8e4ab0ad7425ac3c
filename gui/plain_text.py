"""Text that comes from a report (run ids, precision names, reasons) shown as text only.

Qt renders a QLabel, a tooltip or a message box as HTML when the text looks like HTML,
so a report could put images or headings into the window. Labels get the plain-text
format; tooltips and message boxes, which have no such switch, get escaped HTML.
"""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel


def as_html(text: str | None) -> str:
    """``text`` as HTML that shows exactly those characters; '' for no text."""
    if not text:
        return ""
    return '<p style="white-space:pre-wrap">' + html.escape(text) + "</p>"


def plain_label(text: str = "", wrap: bool = True) -> QLabel:
    label = QLabel(text)
    label.setTextFormat(Qt.TextFormat.PlainText)
    label.setWordWrap(wrap)
    return label
