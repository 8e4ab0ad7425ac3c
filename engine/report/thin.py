"""Monitor samples as reports keep them: thinned per step window, raw in the journal only.

The monitor polls about ten times a second for the whole run (model loading included),
which made a tiny run's JSON report megabytes of host samples. A report keeps, per
source and per window between two consecutive step ends (of any trial), the window's
last sample (one per step) and the samples holding each field's minimum and maximum in
it, so spikes and dips survive (and any poll carrying GPM's reason). Every kept sample
is a real poll, unchanged; the journal keeps them all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from engine.core.events import MonitorSample
from engine.record.columns import Columns
from engine.record.run_record import RunRecord

SAMPLING_NOTE = ("thinned for the report: per step window, the last poll and the polls "
                 "holding each field's minimum and maximum; every poll is in the run journal")
_NUMERIC = tuple(f.name for f in dataclasses.fields(MonitorSample)
                 if f.name != "time_s" and f.type in ("float | None", "int | None"))


def _columns(samples: Sequence[MonitorSample]) -> Columns:
    if isinstance(samples, Columns):
        return samples
    columns = Columns(MonitorSample)
    for s in samples:
        columns.append(s)
    return columns


def _last_of_each(groups: np.ndarray) -> np.ndarray:
    """Positions of a sorted key array where a run of equal keys ends."""
    return np.flatnonzero(np.append(groups[1:] != groups[:-1], True))


def thin_samples(samples: Sequence[MonitorSample], step_ends_s: list[float]
                 ) -> list[MonitorSample]:
    """``samples`` reduced as the module says; ``step_ends_s`` bound the windows. Whole
    columns at once: a long run's journal holds hundreds of thousands of polls."""
    columns = _columns(samples)
    if not len(columns):
        return []
    bounds = np.sort(np.asarray(step_ends_s, dtype=np.float64))
    times = columns.column("time_s")
    # a window: one source between two consecutive step ends (bisect_left's side)
    window = (columns.column("source").astype(np.int64) * (len(bounds) + 1)
              + np.searchsorted(bounds, times, side="left"))
    rows = np.arange(len(columns))
    order = np.lexsort((rows, window))
    keep = np.zeros(len(columns), dtype=bool)
    keep[order[_last_of_each(window[order])]] = True  # each window's last poll
    keep |= columns.column("gpm_reason") >= 0  # GPM's reason rides on one poll only
    for name in _NUMERIC:
        values = columns.column(name)
        known = np.flatnonzero(~np.isnan(values))
        if not len(known):
            continue
        # by window, then value, then row: a window's first row holds its minimum (the
        # earliest of equal ones), its last row the maximum (the latest of equal ones)
        order = known[np.lexsort((known, values[known], window[known]))]
        ends = _last_of_each(window[order])
        keep[order[ends]] = True
        keep[order[np.concatenate(([0], ends[:-1] + 1))]] = True
    kept = np.flatnonzero(keep)
    kept = kept[np.argsort(times[kept], kind="stable")]
    return [columns[int(i)] for i in kept]


def for_report(record: RunRecord) -> RunRecord:
    """The record a report writes: the same run, its monitor series thinned."""
    if record.monitor_sampling is not None:  # thinned already (a report written again)
        return record
    ends = []
    for p in {t.precision for t in record.trials} | set(record.live_steps):
        steps = record.steps(p)
        ends.extend(steps.column("time_s") if isinstance(steps, Columns)
                    else [s.time_s for s in steps])
    return dataclasses.replace(record, monitor_samples=thin_samples(record.monitor_samples, ends),
                               monitor_sampling=SAMPLING_NOTE)
