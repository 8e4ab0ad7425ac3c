"""pyqtgraph's global look for AmpScope: dark text on white, as in the exported reports."""

import pyqtgraph as pg

pg.setConfigOptions(background="w", foreground="#222222", antialias=True)
