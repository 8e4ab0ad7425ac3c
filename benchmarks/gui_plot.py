"""Redraw cost of the live charts at 1,000 vs 100,000 points per curve.

Fills every step chart of ``gui.live_charts.LiveCharts`` with N steps for three
precisions, then times one redraw (``flush`` hands the changed curves to ``setData``,
``grab`` paints the widget) and prints the ratio. With downsampling and clip-to-view
the 100x more points should cost far less than 100x the time.

    QT_QPA_PLATFORM=offscreen python benchmarks/gui_plot.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from PySide6.QtWidgets import QApplication  # noqa: E402

from engine.core.events import StepSample  # noqa: E402

PRECISIONS = ("fp32", "bf16-amp", "fp16-amp")
REPEATS = 15


def _fill(charts, n: int) -> None:
    for p in PRECISIONS:
        for i in range(n):
            charts.add_step(StepSample(
                precision=p, step=i, warmup=False, loss=5.0 / (1 + i * 1e-3) + (i % 7) * 0.01,
                step_ms=10.0 + (i % 13), tokens_per_s=1000.0 + (i % 11), tflops=None,
                mfu=0.3 + (i % 5) * 0.01, allocated_bytes=2**30 + (i % 3) * 2**20,
                reserved_bytes=2**31, loss_scale=2.0 ** (16 - (i % 50 == 0)),
                skipped=i % 50 == 0, grad_norm=1.0, time_s=float(i)))


def redraw_ms(n: int) -> float:
    from gui.live_charts import LiveCharts

    charts = LiveCharts(capacity=max(n, 1))
    charts.resize(1400, 700)
    charts.show()
    _fill(charts, n)
    charts.flush()
    charts.grab()  # first paint builds caches; not what a live update costs
    times = []
    for _ in range(REPEATS):
        # one more point on every curve, as a live step does, then one redraw
        _fill_one = StepSample("fp32", n, False, 1.0, 10.0, 1000.0, None, 0.3, 2**30, 2**31,
                               2.0**16, False, 1.0, float(n))
        charts.add_step(_fill_one)
        start = time.perf_counter()
        charts.flush()
        charts.grab()
        times.append((time.perf_counter() - start) * 1e3)
    charts.close()
    return statistics.median(times)


def main() -> None:
    QApplication.instance() or QApplication([])
    small = redraw_ms(1_000)
    large = redraw_ms(100_000)
    print(f"redraw with   1,000 points per curve: {small:8.2f} ms (median of {REPEATS})")
    print(f"redraw with 100,000 points per curve: {large:8.2f} ms (median of {REPEATS})")
    print(f"ratio 100k / 1k: {large / small:.2f}x for 100x the points")


if __name__ == "__main__":
    main()
