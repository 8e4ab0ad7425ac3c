"""The user cache folder, where measurements made once per machine are kept (the matmul
peak, the fp8 shape timings): platformdirs' own, or ``$AMPSCOPE_CACHE_DIR`` where set."""

from __future__ import annotations

import json
import os
from pathlib import Path

import platformdirs

from engine.core.atomic import atomic_write

CACHE_DIR_ENV = "AMPSCOPE_CACHE_DIR"


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_DIR_ENV) or platformdirs.user_cache_dir("AmpScope"))


def read_entries(path: Path) -> dict:
    """The entries of the cache file at ``path``: {} where there is none yet or it is damaged
    (what it held is measured again)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_entries(path: Path, entries: dict) -> None:
    """Replace the cache file at ``path`` whole: a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda fh: json.dump(entries, fh, indent=1, sort_keys=True))
