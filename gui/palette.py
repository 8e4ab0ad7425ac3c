"""Qt colours for precisions and memory categories, taken from the engine's palette."""

from __future__ import annotations

from PySide6.QtGui import QColor

from engine.record.colors import color_of

_UNKNOWN = "#444444"

# Memory categories of the stacked bars (kept apart from the precision colours, which
# name the bars on the axis): a sequential blue-to-sand ramp reads as "parts of one".
MEMORY_CATEGORY_COLORS: dict[str, str] = {
    "parameters": "#1F4E79",
    "gradients": "#4A7FB0",
    "optimizer state": "#8FB8DE",
    "weight copies": "#A8D5BA",
    "activations": "#D9B56C",
    "other": "#BBBBBB",
}


def precision_color(label: str) -> QColor:
    """Colour of a precision; ``run-id/precision`` labels (history comparisons) too."""
    return QColor(color_of(label.rsplit("/", 1)[-1], _UNKNOWN))
