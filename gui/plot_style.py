"""pyqtgraph's global look for AmpScope: dark text on white, as in the exported reports.

Antialiasing stays off: on a software-rendered window it makes a 100,000-point curve
about 70x slower to paint (see benchmarks/gui_plot.py), and the curves are 2 px wide.
"""

import pyqtgraph as pg

pg.setConfigOptions(background="w", foreground="#222222", antialias=False)
