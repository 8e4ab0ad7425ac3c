"""The traced step's memory timeline, as the plan reports it (engine.run.plan calls this).

The plan's step is traced by the same ``tracked_step`` a trial runs, so its timeline comes
from the same watcher (engine.measure.memtrack); under ``--strategy ddp`` the gradient
buckets DDP allocates when it wraps the model are computed, not traced, and are held
for the whole step: they join the timeline as a category of their own, so its highest
point is the plan's peak.
"""

from __future__ import annotations

import dataclasses

DDP_BUCKETS = "ddp_buckets"


def traced_timeline(measured, buckets: int = 0):
    """``measured``: the traced step's MeasuredPeak; ``buckets``: DDP's bucket bytes."""
    timeline = measured.timeline
    if timeline is None or not buckets:
        return timeline
    points = [dataclasses.replace(p, category_bytes=[*p.category_bytes, buckets])
              for p in timeline.points]
    return dataclasses.replace(
        timeline, categories=[*timeline.categories, DDP_BUCKETS], points=points,
        peak_bytes=timeline.peak_bytes + buckets,
        method=f"{timeline.method}; DDP's gradient buckets ({buckets:,} B) computed, not "
               "traced, held for the whole step")
