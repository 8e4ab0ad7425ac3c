"""The memory step's timeline: bytes by category at every allocation change, thinned.

``MemoryWatcher`` (engine.measure.memtrack) logs each change of its live bytes as one row
(aten ops so far, storage record, bytes added or released, segment, module). Here the rows
become running sums per category, and a few hundred of them are kept: the step's first
moment, the first moment of each segment (phase, checkpointed layer's recompute), the
peak (the first moment it was reached, exactly the watcher's peak), the last moment, and
in each window of consecutive changes the moments holding the most and the fewest
bytes, so every rise and dip shows. Each kept point is a real moment, unchanged.

A storage counts under the category it ends the step with (or had when it was freed),
as the peak's categories do: a buffer autograd allocates to become a ``.grad`` is a
gradient from its allocation on.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np

from engine.core.events import MemoryTimeline, MemoryTimelinePoint

MAX_POINTS = 400  # the target; phase starts are kept beyond it (a layer count's worth)
# None: every change is a point (engine.run.plan_scale_timeline extends cut models' steps
# change by change, then thins the result as build_timeline would have)
_THIN_TO: ContextVar[int | None] = ContextVar("thin_to", default=MAX_POINTS)
METHOD = ("bytes by category after each of the step's {changes:,} allocation changes "
          "({ops:,} aten ops), {kept} kept: the first moment of each phase, the peak, and in "
          "each window of changes the moments of most and fewest bytes; a storage counts "
          "under the category it ends with (a gradient from its allocation)")


@contextmanager
def unthinned():
    """Timelines built inside keep every change."""
    token = _THIN_TO.set(None)
    try:
        yield
    finally:
        _THIN_TO.reset(token)


def _keep(totals: np.ndarray, starts: np.ndarray, max_points: int | None) -> np.ndarray:
    n = len(totals)
    if max_points is None or n <= max_points:
        return np.arange(n)
    keep = {0, n - 1, int(np.argmax(totals))} | {int(i) for i in starts}
    windows = max(1, (max_points - len(keep)) // 2)
    for window in np.array_split(np.arange(n), windows):
        part = totals[window]
        keep.add(int(window[np.argmax(part)]))  # the first of equal maxima
        keep.add(int(window[np.argmin(part)]))
    return np.array(sorted(keep))


def _frees_in_order(rows: np.ndarray, category: np.ndarray, entered: int) -> np.ndarray:
    """The rows with each run of storages freed together (no op between them, same
    segment and module) in one order, by category and size: the order weak references
    report them in is arbitrary, and a scaled plan (engine.run.plan_scale_timeline)
    matches one step's changes against another's."""
    free = rows[:, 2] < 0
    key = rows[:, [0, 3, 4]]
    same = np.append(False, (key[1:] == key[:-1]).all(axis=1) & free[1:] & free[:-1])
    run = np.cumsum(~same)
    run[:entered] = -1  # what the step began with stays as logged
    order = np.lexsort((np.arange(len(rows)), rows[:, 2], category, run))
    return rows[order]


def build_timeline(log: Sequence[tuple[int, int, int, int, int]], entered: int,
                   record_categories: Sequence[int], categories: Sequence[str],
                   segments: Sequence[str], modules: Sequence[str | None], ops: int,
                   max_points: int | None = -1) -> MemoryTimeline:
    """``log``: the watcher's rows (ops, record, bytes, segment, module); rows before
    ``entered`` are what the step began with; ``record_categories``: each record's final
    category as an index into ``categories``; ``max_points`` -1: the current setting
    (MAX_POINTS, or every change inside ``unthinned``)."""
    max_points = _THIN_TO.get() if max_points == -1 else max_points
    rows = np.asarray(log, dtype=np.int64).reshape(-1, 5)
    final = np.asarray(record_categories or [0], dtype=np.int64)
    rows = _frees_in_order(rows, final[rows[:, 1]], entered)
    category = final[rows[:, 1]]
    delta = rows[:, 2]
    step = slice(entered, None)
    totals = np.cumsum(delta)[step]
    segment = rows[step, 3]
    starts = np.flatnonzero(np.append(True, segment[1:] != segment[:-1]))
    kept = _keep(totals, starts, max_points)
    by_category = np.stack([np.cumsum(np.where(category == c, delta, 0))[step][kept]
                            for c in range(len(categories))], axis=1)
    peak = int(np.argmax(totals))
    ops_at, modules_at = rows[step, 0][kept], rows[step, 4][kept]
    points = [MemoryTimelinePoint(op_index=int(ops_at[i]), phase=segments[segment[k]],
                                  category_bytes=[int(b) for b in by_category[i]],
                                  module=modules[modules_at[i]])
              for i, k in enumerate(kept)]
    return MemoryTimeline(
        categories=list(categories), points=points,
        peak_index=int(np.searchsorted(kept, peak)), peak_bytes=int(totals[peak]), ops=ops,
        changes=len(totals),
        method=METHOD.format(changes=len(totals), ops=ops, kept=len(points)))


def thin(points: Sequence[MemoryTimelinePoint], categories: Sequence[str], ops: int,
         max_points: int = MAX_POINTS) -> MemoryTimeline:
    """The timeline build_timeline makes from a step whose every change is in ``points``
    (one point per change, as ``unthinned`` builds them): the same points kept."""
    totals = np.array([sum(p.category_bytes) for p in points], dtype=np.int64)
    phases = [p.phase for p in points]
    starts = np.flatnonzero([True, *(a != b for a, b in zip(phases, phases[1:]))])
    kept = _keep(totals, starts, max_points)
    peak = int(np.argmax(totals))
    return MemoryTimeline(
        categories=list(categories), points=[points[int(i)] for i in kept],
        peak_index=int(np.searchsorted(kept, peak)), peak_bytes=int(totals[peak]), ops=ops,
        changes=len(points), method=METHOD.format(changes=len(points), ops=ops, kept=len(kept)))
