"""Monitor samples as reports keep them: thinned per step window, raw in the journal only.

The monitor polls about ten times a second for the whole run (model loading included),
which made a tiny run's JSON report megabytes of host samples. A report keeps, per
source and per window between two consecutive step ends (of any trial), the window's
last sample (one per step) and the samples holding each field's minimum and maximum in
it, so spikes and dips survive (and any poll carrying GPM's reason). Every kept sample
is a real poll, unchanged; the journal keeps them all.
"""

from __future__ import annotations

import bisect
import dataclasses

from engine.events import MonitorSample
from engine.record import RunRecord

SAMPLING_NOTE = ("thinned for the report: per step window, the last poll and the polls "
                 "holding each field's minimum and maximum; every poll is in the run journal")
_NUMERIC = tuple(f.name for f in dataclasses.fields(MonitorSample)
                 if f.name != "time_s" and f.type in ("float | None", "int | None"))


def _kept(window: list[MonitorSample]) -> set[int]:
    # GPM's reason rides on the first poll that meets it only
    keep = {len(window) - 1} | {i for i, s in enumerate(window) if s.gpm_reason is not None}
    for name in _NUMERIC:
        values = [(getattr(s, name), i) for i, s in enumerate(window)
                  if getattr(s, name) is not None]
        if values:
            keep.add(min(values)[1])
            keep.add(max(values)[1])
    return keep


def thin_samples(samples: list[MonitorSample], step_ends_s: list[float]) -> list[MonitorSample]:
    """``samples`` reduced as the module says; ``step_ends_s`` bound the windows."""
    bounds = sorted(step_ends_s)
    windows: dict[tuple[str, int], list[MonitorSample]] = {}
    for s in samples:
        windows.setdefault((s.source, bisect.bisect_left(bounds, s.time_s)), []).append(s)
    kept = [w[i] for w in windows.values() for i in _kept(w)]
    return sorted(kept, key=lambda s: s.time_s)


def for_report(record: RunRecord) -> RunRecord:
    """The record a report writes: the same run, its monitor series thinned."""
    if record.monitor_sampling is not None:  # thinned already (a report written again)
        return record
    ends = [s.time_s for p in {t.precision for t in record.trials} | set(record.live_steps)
            for s in record.steps(p)]
    return dataclasses.replace(record, monitor_samples=thin_samples(record.monitor_samples, ends),
                               monitor_sampling=SAMPLING_NOTE)
