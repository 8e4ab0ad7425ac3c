"""An early word that the host is too busy to rank speeds, and what to do about it.

The speed verdict refuses to rank a busy host (``engine.measure.contention``), but only when
the last trial has finished: on a loaded 2-core machine that is many minutes later. This
watches the monitor's host-load samples as they arrive and says it once, within the first
trial, after ``WINDOW_S`` of samples that break the same rule.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.core.events import LogEvent, MonitorSample
from engine.measure.contention import OTHER_CPU_LIMIT_PCT, OVERSUBSCRIBED_PER_CORE

WINDOW_S = 2.0  # seconds of samples: one burst of another program is not "busy"
ADVICE = ("speeds will not be ranked at the end of this run. To do: stop the run, close "
          "other programs and runs (or wait for them) and start again; or let it go on for "
          "memory, loss and lost updates, which do not depend on speed")


class BusyNotice:
    """Feed it every event; it emits one warning ``LogEvent`` when a window of host-load
    samples breaks the contention rule."""

    def __init__(self, cores: int, emit: Callable[[object], None]):
        self.cores, self.emit = cores, emit
        self.window: list[MonitorSample] = []
        self.said = False

    def observe(self, event) -> None:
        if self.said or not isinstance(event, MonitorSample):
            return
        if event.load_avg_1m is None and event.other_cpu_pct is None:
            return
        self.window.append(event)
        if event.time_s - self.window[0].time_s < WINDOW_S:
            return
        what = self._busy()
        self.window = []
        if what:
            self.said = True
            self.emit(LogEvent("warning", f"the machine is busy ({what}): {ADVICE}", None,
                               time.time()))

    def _busy(self) -> str | None:
        loads = [s.load_avg_1m for s in self.window if s.load_avg_1m is not None]
        others = [s.other_cpu_pct for s in self.window if s.other_cpu_pct is not None]
        limit = OVERSUBSCRIBED_PER_CORE * self.cores
        if loads and sum(loads) / len(loads) > limit:
            return (f"1-minute load average {sum(loads) / len(loads):.1f} on {self.cores} "
                    f"cores, limit {limit:g}")
        if others and sum(others) / len(others) > OTHER_CPU_LIMIT_PCT:
            return (f"other processes use {sum(others) / len(others):.0f}% of the CPU, limit "
                    f"{OTHER_CPU_LIMIT_PCT:.0f}%")
        return None
