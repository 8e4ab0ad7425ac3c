"""AmpScope's desktop window: the only package that imports Qt (PySide6 + pyqtgraph)."""
