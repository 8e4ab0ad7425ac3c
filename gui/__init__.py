"""AmpScope's desktop window: the only package that imports Qt (PySide6 + pyqtgraph)."""

from gui import refcount_guard  # noqa: F401 (must run before any other Qt call)
