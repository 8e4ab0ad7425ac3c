"""The fp8 per-shape timings cached per device (engine.measure.fp8_shape_timing measures
them), read without torch: a payoff table looks its card's figures up here, and a report of a
run needs no torch to be written."""

from __future__ import annotations

from pathlib import Path

from engine.core.cache_dir import cache_dir, read_entries, write_entries
from engine.measure.peaks import _entry as peak_entry

CACHE_FILE = "fp8_shape_timing.json"


def shape_key(m: int, k: int, n: int) -> str:
    return f"{m}x{k}x{n}"


def cache_path() -> Path:
    return cache_dir() / CACHE_FILE


def read_cache() -> dict:
    return read_entries(cache_path())


def write_cache(entries: dict) -> None:
    write_entries(cache_path(), entries)


def speedup(shape: dict, label: str) -> float | None:
    """A cached shape's measured speed-up of ``label``: bf16 median over its median."""
    low, bf16 = shape.get(label), shape.get("bf16")
    if not (isinstance(low, dict) and isinstance(bf16, dict)):
        return None
    times = (bf16.get("median_ms"), low.get("median_ms"))
    if not all(isinstance(t, (int, float)) and t > 0 for t in times):
        return None  # a damaged or hand-edited entry: no figure rather than a wrong one
    return times[0] / times[1]


def card_entries(card: str) -> list[dict]:
    """The cached GPU entries whose device is ``card`` in the peaks table, newest first."""
    row = peak_entry(card)
    if row is None:
        return []
    found = [e for e in read_cache().values() if isinstance(e, dict)
             and e.get("kind") == "cuda" and isinstance(e.get("device"), str)
             and isinstance(e.get("shapes"), dict)
             and (peak_entry(e["device"]) or {}).get("name") == row["name"]]
    return sorted(found, key=lambda e: -e["measured_at_s"]
                  if isinstance(e.get("measured_at_s"), (int, float)) else 0)


def add_measured(data: dict, lookup: dict) -> None:
    """Set each payoff layer row's ``measured_speedup`` and ``measured_on`` (both None
    where no timing of that card and shape is cached): ``data`` as engine.measure.
    fp8_payoff.payoff makes it, ``lookup`` its key -> the card's name."""
    for key, recipes in data.items():
        if "reason" in recipes:
            continue
        entries = card_entries(lookup.get(key, key))
        for label, entry in recipes.items():
            for row in entry["layers"]:
                name = shape_key(row["m"], row["k"], row["n"])
                found = next(((e, s) for e in entries if isinstance(e["shapes"].get(name), dict)
                              and (s := speedup(e["shapes"][name], label))), None)
                row["measured_speedup"] = None if found is None else found[1]
                row["measured_on"] = None if found is None else found[0]["device"]
