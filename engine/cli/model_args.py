"""The options that pick a model and its precisions, shared by ``profile``, ``footprint``,
``numerics`` and ``fit``, and the precisions' lines their help ends with."""

from __future__ import annotations

import argparse

from engine.core.config import PRECISIONS


def precision_lines() -> str:
    """Each precision and what it trains, one line each (``--help`` and ``presets``)."""
    from engine.core.resources import precision_descriptions

    texts = precision_descriptions()
    width = max(map(len, texts))
    return "\n".join(f"  {name:<{width}} {text}" for name, text in texts.items())


def add_model_args(p: argparse.ArgumentParser, precisions_default: str) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter  # keep the lines below as written
    p.epilog = f"precisions:\n{precision_lines()}"
    p.add_argument("--model", default="tiny",
                   help="preset name (see 'presets'), a local model folder, or a cached hub id")
    p.add_argument("--precision", default=precisions_default,
                   help=f"comma-separated, from: {','.join(PRECISIONS)}; RECIPE+OPTIM "
                        "gives one trial its own optimizer (e.g. bf16-amp+adamw8bit)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow a model folder or hub id to run its own code")
    p.add_argument("--seed", type=int, default=0)
