"""NaN and Infinity in a run's files: kept only where they are measurements.

A loss or a gradient norm that overflowed is a finding (the run diverged) and is written
as the bare JSON tokens ``NaN`` / ``Infinity`` (docs/report-schema.md, the null rule).
Anywhere else a non-finite number is a reading that failed: NVML's GPM returns NaN with a
success code for a window in which the GPU did no work (0/0). The writers (journal and
JSON report) write such a number as null, n/a, and say so once, rather than fail a
user's run; a report an older AmpScope already wrote with one opens with those fields
n/a and a note naming the file and the fields (``repair_note``).
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections import Counter

from engine.record.validate import NONFINITE_FIELDS

REASON = ("n/a: the value read was not a finite number (NVML's GPM gives NaN for a window "
          "in which the GPU did no work, 0/0)")


def scrub(value, key: str = "", path: str = "",
          found: dict[str, float] | None = None) -> tuple[object, list[str]]:
    """``value`` (parsed or about-to-be-written JSON) with each non-finite number outside
    ``NONFINITE_FIELDS`` replaced by None, and the paths of the numbers replaced (in
    ``found`` too, with the number). The items of a list are checked under the list's own
    key, as the report's checks do."""
    repaired: list[str] = []

    def walk(v, name: str, where: str):
        if isinstance(v, float):
            if math.isfinite(v) or name in NONFINITE_FIELDS:
                return v
            repaired.append(where)
            if found is not None:
                found[where] = v
            return None
        if isinstance(v, dict):
            return {k: walk(x, str(k), f"{where}.{k}" if where else str(k))
                    for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [walk(x, name, f"{where}[{i}]") for i, x in enumerate(v)]
        return v

    return walk(value, key, path), repaired


def fold(path: str) -> str:
    """A path with its list positions folded: ``monitor_samples[].x``."""
    return re.sub(r"\[\d+\]", "[]", path)


def fields_of(paths: list[str]) -> str:
    """The repaired paths by field, list positions folded: ``monitor_samples[].x (6 values)``."""
    counts = Counter(fold(p) for p in paths)
    first: dict[str, str] = {}
    for p in paths:
        first.setdefault(fold(p), p)
    return ", ".join(f"{name} ({n} values)" if n > 1 else first[name]
                     for name, n in counts.items())


def unrepairable(problem: str, found: dict[str, float]) -> str:
    """The report check's ``problem`` about a field ``scrub`` nulled that may not be null
    (a step time, a timestamp): said as the number it was, which is what is wrong."""
    where, _, rest = problem.partition(": ")
    if where in found and rest.startswith("expected"):
        return f"{where}: {found[where]} is not a valid value here"
    return problem


def repair_note(source: str, paths: list[str]) -> str:
    return (f"{source} was repaired on reading: {fields_of(paths)} held NaN or Infinity, "
            "which is no measurement there (an older AmpScope wrote NVML's NaN for an idle "
            "GPM window); shown as n/a")


def write_note(paths: list[str], where: str) -> str:
    return (f"{fields_of(paths)} held NaN or Infinity where a hardware reading goes: written "
            f"to {where} as null (n/a)")


def dump_json(data: dict, fh, where: str, **kwargs) -> list[str]:
    """``json.dump`` of a report or journal dict to ``fh`` by ``scrub``'s rule; the paths
    written as null, said once in the file's own ``logs`` and to the ``ampscope`` logger.
    The common case, nothing non-finite, is one strict dump (no walk in Python)."""
    start = fh.tell()
    try:
        json.dump(data, fh, allow_nan=False, **kwargs)
        return []
    except ValueError:
        fh.seek(start)
        fh.truncate()
    clean, paths = scrub(data)
    if paths:
        note = write_note(paths, where)
        logging.getLogger("ampscope").warning(note)
        if isinstance(clean.get("logs"), list):
            clean["logs"].append({"level": "warning", "message": note, "precision": None,
                                  "time_s": time.time()})
    json.dump(clean, fh, **kwargs)
    return paths
