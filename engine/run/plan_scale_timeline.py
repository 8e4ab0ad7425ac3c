"""The full model's memory timeline from its cut models' steps (engine.run.plan_scale).

A step is a sequence of allocation changes. The model cut to one more repeat of its layer
pattern makes the same changes plus one more repeat's worth, inserted where the layers run
(forward, each checkpointed layer's recompute, backward, the optimiser's loop over
parameters). So the cut traces keep every change (engine.measure.memory_timeline's
``unthinned``); difflib aligns the first cut's changes with the second's, where the only
differences must be insertions; inserting each block twice must give the third cut's
changes exactly (else the timeline is not scaled); inserting it once per missing repeat
gives the full model's changes, which are summed and thinned as a traced step's are. A
change is compared by what it does (its phase and module with the layer number left out,
the aten ops since the last change, the bytes it adds to each category), so the scaled
timeline has the full trace's points, phases and bytes; layer numbers in module and
phase names are counted on from the cut's.
"""

from __future__ import annotations

import dataclasses
import difflib
import re

import numpy as np

from engine.core.events import MemoryTimeline, MemoryTimelinePoint
from engine.measure.memory_timeline import thin

_LAYER = re.compile(r"(?<=\.)\d+(?=\.|$)")  # the first number in a dotted module path


def _layer(name: str | None) -> int | None:
    match = _LAYER.search(name or "")
    return int(match.group()) if match else None


def _renumber(name: str | None, layer: int) -> str | None:
    return _LAYER.sub(str(layer), name, count=1) if name else name


def _changes(timeline: MemoryTimeline) -> list[tuple]:
    """One hashable token per change: what it does, not which layer did it."""
    first = timeline.points[0]
    out, ops, held = [], first.op_index, np.asarray(first.category_bytes, dtype=np.int64)
    for p in timeline.points:
        now = np.asarray(p.category_bytes, dtype=np.int64)
        out.append((_LAYER.sub("#", p.phase, count=1),
                    _LAYER.sub("#", p.module, count=1) if p.module else None,
                    p.op_index - ops, tuple((now - held).tolist())))
        ops, held = p.op_index, now
    return out


def _inserts(a: list, b: list):
    """[(position in a, b's slice inserted there)], or None where b is not a plus insertions."""
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    blocks = []
    for tag, i1, _, j1, j2 in matcher.get_opcodes():
        if tag == "insert":
            blocks.append((i1, j1, j2))
        elif tag != "equal":
            return None
    return blocks


def _extend(points: list, tokens: list, blocks: list, other: list, copies: int, period: int,
            first_new: int) -> list[tuple]:
    """(token, phase, module) of the cut model's changes with ``copies`` of each block
    inserted; layers from ``first_new`` on (the cut's remainder) move ``copies`` periods
    on, the copies take the layers between, counted down where the layers run backwards."""
    def names(p, layer_of):
        out = []
        for name in (p.phase, p.module):
            layer = _layer(name)
            out.append(name if layer is None else _renumber(name, layer_of(layer)))
        return tuple(out)

    def moved(layer):  # the cut's remainder moves on by the inserted periods
        return layer + copies * period if layer >= first_new else layer

    out, at = [], 0
    for position, j1, j2 in [*blocks, (len(points), 0, 0)]:
        out += [(tokens[i], *names(points[i], moved)) for i in range(at, position)]
        at = position
        block = other[j1:j2]
        layers = [_layer(p.module) or _layer(p.phase) for p in points[max(position - 50, 0):
                                                                      position + 50]]
        layers = [n for n in layers if n is not None]
        backwards = len(layers) > 1 and layers[0] > layers[-1]
        for k in range(copies):
            k = copies - 1 - k if backwards else k
            out += [(tok, *names(p, lambda n, k=k: first_new + k * period
                                 + (n - first_new) % period)) for tok, p in block]
    return out


def scale_timeline(timelines: list, points: tuple, repeats: int, prefix: int, period: int):
    """The timeline of ``repeats`` repeats from unthinned timelines traced at ``points``
    (consecutive repeat counts), or (None, why)."""
    if any(t is None for t in timelines):
        return None, "a cut step has no timeline"
    (t1, t2, _), (n1, _, _) = timelines, points
    a, b, c = (_changes(t) for t in timelines)
    blocks = _inserts(a, b)
    if not blocks:
        return None, "the cut models' steps differ by more than inserted changes"
    other = list(zip(b, t2.points))
    first_new = prefix + n1 * period
    check = _extend(t1.points, a, blocks, other, 2, period, first_new)
    if [tok for tok, *_ in check] != c:
        return None, "one more repeat does not add the same changes at the third cut"
    changes = _extend(t1.points, a, blocks, other, repeats - n1, period, first_new)
    # what the step began with grows alike per repeat (checked as the peak's figures are)
    start = [np.asarray(t.points[0].category_bytes, dtype=np.int64) for t in timelines]
    if not np.array_equal(start[1] - start[0], start[2] - start[1]):
        return None, "the bytes held before the step do not grow alike per repeat"
    held = start[0] + (repeats - n1) * (start[1] - start[0])
    ops = t1.points[0].op_index + (repeats - n1) * (t2.points[0].op_index - t1.points[0].op_index)
    full = []
    for (op_step, delta), phase, module in (((tok[2], tok[3]), ph, mo)
                                            for tok, ph, mo in changes):
        held = held + np.asarray(delta, dtype=np.int64)
        ops += op_step
        full.append(MemoryTimelinePoint(op_index=ops, phase=phase,
                                        category_bytes=held.tolist(), module=module))
    total_ops = t1.ops + (repeats - n1) * (t2.ops - t1.ops)
    scaled = thin(full, t1.categories, total_ops)
    return dataclasses.replace(scaled, method=(
        f"{scaled.method}; scaled: the cut models' changes with one repeat's changes "
        f"inserted {repeats - n1} times (engine.run.plan_scale_timeline)")), ""
