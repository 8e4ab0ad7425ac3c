"""pyqtgraph's global look for AmpScope: dark text on white, as in the exported reports.

Antialiasing stays off: on a software-rendered window it makes a 100,000-point curve
about 70x slower to paint (see benchmarks/gui_plot.py), and the curves are 2 px wide.
"""

import pyqtgraph as pg

pg.setConfigOptions(background="w", foreground="#222222", antialias=False)


def plain_axes(plot: pg.PlotItem) -> None:
    """Axes in the units their labels name: no "(ks)" or "(x0.001)" from pyqtgraph's SI
    prefixes, which rescale the ticks behind the reader's back."""
    for side in ("left", "bottom"):
        plot.getAxis(side).enableAutoSIPrefix(False)
