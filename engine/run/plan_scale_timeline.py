"""The full model's memory timeline from its cut models' steps (engine.run.plan_scale).

A step is a sequence of allocation changes. The model cut to one more repeat of its layer
pattern makes the same changes plus one more repeat's worth, inserted where the layers run
(forward, each checkpointed layer's recompute, backward, the optimiser's loop over
parameters), and storages freed together (no op between them) free one repeat's more. So
the cut traces keep every change (engine.measure.memory_timeline's ``unthinned``); difflib
aligns the first cut's changes with the second's, where the only differences must be
inserted changes and larger runs of frees; applying each difference twice must give the
third cut's changes exactly (else the timeline is not scaled); applying it once per
missing repeat gives the full model's changes, which are summed and thinned as a traced
step's are. A change is compared by what it does (its phase and module with the layer
number left out, the aten ops since the last change, the bytes it adds to each category),
so the scaled timeline has the full trace's points, phases and bytes; layer numbers in
module and phase names are counted on from the cut's.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections import Counter

import numpy as np

from engine.core.events import MemoryTimeline, MemoryTimelinePoint
from engine.measure.memory_timeline import thin

_LAYER = re.compile(r"(?<=\.)\d+(?=\.|$)")  # the first number in a dotted module path
FREES = "frees"  # a run of storages freed together: its changes are a multiset


def _layer(name: str | None) -> int | None:
    match = _LAYER.search(name or "")
    return int(match.group()) if match else None


def _plain(name: str | None) -> str | None:
    return _LAYER.sub("#", name, count=1) if name else name


@dataclasses.dataclass
class _Group:
    """One change, or a run of frees: ``key`` is what difflib compares."""

    key: tuple
    deltas: list  # the changes' bytes by category, tuples
    point: MemoryTimelinePoint  # the first change's point: its phase and module


def _groups(timeline: MemoryTimeline, layer_key=lambda n: n) -> list[_Group]:
    """The step's changes, runs of frees (as engine.measure.memory_timeline orders them)
    grouped; ``layer_key`` says how a layer number is compared (the second cut's new
    repeat is told apart, so that difflib inserts it where it ran)."""
    def keyed(name):
        n = _layer(name)
        return name if n is None else _LAYER.sub(str(layer_key(n)), name, count=1)

    out: list[_Group] = []
    ops, held = timeline.points[0].op_index, np.asarray(timeline.points[0].category_bytes)
    for p in timeline.points:
        now = np.asarray(p.category_bytes, dtype=np.int64)
        delta, step = tuple((now - held).tolist()), p.op_index - ops
        ops, held = p.op_index, now
        free = sum(delta) < 0
        last = out[-1] if out else None
        if (free and step == 0 and last is not None and last.key[3] == FREES
                and (last.point.phase, last.point.module) == (p.phase, p.module)):
            last.deltas.append(delta)
            continue
        out.append(_Group((keyed(p.phase), keyed(p.module), step,
                           FREES if free else delta), [delta], p))
    # a run is aligned with runs freeing the same sizes (another repeat frees more of them)
    for g in out:
        if g.key[3] == FREES:
            g.key = (*g.key, frozenset(g.deltas))
    return out


def _differences(a: list[_Group], b: list[_Group]):
    """How b differs from a: ([(position in a, b's groups inserted there: start, end)],
    {position in a: frees a run there gains}), or None where it differs otherwise."""
    inserts, grows = [], {}
    matcher = difflib.SequenceMatcher(None, [g.key for g in a], [g.key for g in b],
                                      autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "insert":
            inserts.append((i1, j1, j2))
        elif tag != "equal":
            return None
        else:
            for i, j in zip(range(i1, i2), range(j1, j2)):
                more = Counter(b[j].deltas)
                more.subtract(a[i].deltas)
                if any(v < 0 for v in more.values()):
                    return None
                if any(more.values()):
                    grows[i] = +more
    return inserts, grows


def _free_order(delta: tuple) -> tuple:
    """engine.measure.memory_timeline's order within a run of frees: category, size."""
    category = next((i for i, v in enumerate(delta) if v), 0)
    return category, delta[category]


def _extend(a: list[_Group], b: list[_Group], inserts: list, grows: dict, copies: int,
            period: int, first_new: int) -> list[tuple]:
    """(ops since the last change, bytes by category, phase, module) of each change of
    the cut model's step with ``copies`` of each difference applied; layers from
    ``first_new`` on (the cut's remainder) move ``copies`` periods on, the copies take the
    layers between, counted down where the layers run backwards there."""
    def names(p, layer_of):
        return tuple(name if _layer(name) is None else
                     _LAYER.sub(str(layer_of(_layer(name))), name, count=1)
                     for name in (p.phase, p.module))

    def moved(layer):
        return layer + copies * period if layer >= first_new else layer

    def changes(group, deltas, named):
        return [(group.key[2] if i == 0 else 0, d, *named) for i, d in enumerate(deltas)]

    def named_layer(group):
        n = _layer(group.point.module)
        return n if n is not None else _layer(group.point.phase)

    out, at = [], 0
    for position, j1, j2 in [*inserts, (len(a), 0, 0)]:
        for i in range(at, position):
            deltas = a[i].deltas
            if i in grows:
                runs = Counter(deltas)
                for delta, count in grows[i].items():
                    runs[delta] += copies * count
                deltas = sorted(runs.elements(), key=_free_order)
            out += changes(a[i], deltas, names(a[i].point, moved))
        at = position
        # the second cut's layers next to the new repeat: a later one before it, or an
        # earlier one after it, means the layers run backwards here
        before = [n for g in b[max(j1 - 50, 0):j1] if (n := named_layer(g)) is not None]
        after = [n for g in b[j2:j2 + 50] if (n := named_layer(g)) is not None]
        backwards = (bool(before) and before[-1] >= first_new + period) or \
            (bool(after) and after[0] < first_new)
        for k in range(copies):
            k = copies - 1 - k if backwards else k
            for group in b[j1:j2]:
                out += changes(group, group.deltas, names(
                    group.point, lambda n, k=k: first_new + k * period + (n - first_new) % period))
    return out


def scale_timeline(timelines: list, points: tuple, repeats: int, prefix: int, period: int):
    """The timeline of ``repeats`` repeats from unthinned timelines traced at ``points``
    (consecutive repeat counts), or (None, why)."""
    if any(t is None for t in timelines):
        return None, "a cut step has no timeline"
    (t1, t2, t3), n1 = timelines, points[0]
    first_new = prefix + n1 * period
    a = _groups(t1)
    b = _groups(t2, lambda n: n if n < first_new else
                f"new{n}" if n < first_new + period else n - period)
    found = _differences(a, b)
    if found is None:
        return None, "the cut models' steps differ by more than one repeat's changes"
    third = [(g.key[2] if i == 0 else 0, d, _plain(g.point.phase), _plain(g.point.module))
             for g in _groups(t3) for i, d in enumerate(g.deltas)]
    check = [(s, d, _plain(ph), _plain(mo))
             for s, d, ph, mo in _extend(a, b, *found, 2, period, first_new)]
    if check != third:
        return None, "one more repeat does not change the step alike at the third cut"
    # what the step began with grows alike per repeat (checked as the peak's figures are)
    start = [np.asarray(t.points[0].category_bytes, dtype=np.int64) for t in timelines]
    if not np.array_equal(start[1] - start[0], start[2] - start[1]):
        return None, "the bytes held before the step do not grow alike per repeat"
    more = repeats - n1
    held = start[0] + more * (start[1] - start[0])
    first_ops = [t.points[0].op_index for t in (t1, t2)]
    ops = first_ops[0] + more * (first_ops[1] - first_ops[0])
    changes = _extend(a, b, *found, more, period, first_new)
    steps = (ops + np.cumsum([c[0] for c in changes])).tolist()
    totals = (held + np.cumsum(np.asarray([c[1] for c in changes], dtype=np.int64),
                               axis=0)).tolist()
    full = [MemoryTimelinePoint(op_index=at, phase=phase, category_bytes=bytes_, module=module)
            for at, bytes_, (_, _, phase, module) in zip(steps, totals, changes, strict=True)]
    scaled = thin(full, t1.categories, t1.ops + more * (t2.ops - t1.ops))
    return dataclasses.replace(scaled, method=(
        f"{scaled.method}; scaled: the cut model's changes with one repeat's more applied "
        f"{more} times (engine.run.plan_scale_timeline)")), ""
