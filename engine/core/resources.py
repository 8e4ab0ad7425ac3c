"""Where the data files of ``resources/`` are: beside the packages in a checkout or a
bundle, inside the ``ampscope`` package when installed with pip (pyproject.toml maps
``resources/`` to ``ampscope/resources``)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
RESOURCES = next((p for p in (_ROOT / "resources", _ROOT / "ampscope" / "resources")
                  if p.is_dir()), _ROOT / "resources")


@cache
def precision_descriptions() -> dict[str, str]:
    """One line per precision saying what it trains and how (the Run form, ``--help``,
    ``presets``): ``resources/precisions.json``. Loads without torch."""
    return json.loads((RESOURCES / "precisions.json").read_text(encoding="utf-8"))
