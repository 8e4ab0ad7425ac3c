"""The user cache folder, where measurements made once per machine are kept (the matmul
peak, the fp8 shape timings): platformdirs' own, or ``$AMPSCOPE_CACHE_DIR`` where set."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

CACHE_DIR_ENV = "AMPSCOPE_CACHE_DIR"


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_DIR_ENV) or platformdirs.user_cache_dir("AmpScope"))
