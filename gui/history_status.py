"""How a run ended, as History lists it: the run's own status when every trial is ok, else
what the CLI says at its end ("1 of 1 trials failed", exit 1), with the trials' statuses.

A run's status ("ok") only says the runner reached its end; a run whose only trial ran out
of memory ended "ok" too. The trials' statuses are in the record, or in a journal's
``done`` lines, read here (and kept per file size and time, so a refresh reads each
finished journal once).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from engine.record.run_record import RunRecord

FINE = ("ok", "unsupported")  # the CLI's rule: exit 0 when every trial is one of these
_DONE = (b'{"e": "done"', b'{"e":"done"')
_cache: dict[Path, tuple[tuple[int, int], list[str]]] = {}


def outcome(run_status: str, trial_statuses: list[str]) -> str:
    """"ok", or "1 of 1 trials failed (oom)", or the run's own status ("cancelled")."""
    failed = [s for s in trial_statuses if s not in FINE and s != "cancelled"]
    if not failed:
        return run_status
    counts = ", ".join(f"{n} {s}" if n > 1 else s for s, n in Counter(failed).items())
    return f"{len(failed)} of {len(trial_statuses)} trials failed ({counts})"


def record_outcome(record: RunRecord) -> str:
    return outcome(record.status, [t.status for t in record.trials])


def journal_trial_statuses(path: Path) -> list[str]:
    """The status of each trial a journal finished, in order; [] where it cannot be read."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError:
        return []
    key = (stat.st_size, stat.st_mtime_ns)
    cached = _cache.get(path)
    if cached is not None and cached[0] == key:
        return cached[1]
    statuses = []
    try:
        with open(path, "rb") as fh:
            for line in fh:
                if not line.startswith(_DONE):
                    continue
                try:
                    result = json.loads(line).get("result")
                except (ValueError, RecursionError):
                    continue  # a torn line: the journal's reader names it when opened
                if isinstance(result, dict) and isinstance(result.get("status"), str):
                    statuses.append(result["status"])
    except OSError:
        return []
    _cache[path] = (key, statuses)
    return statuses
