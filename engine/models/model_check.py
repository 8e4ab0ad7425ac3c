"""The model checks of the run preflight that need no torch: fast enough for every edit.

The window runs them as the user types, so that a missing folder or a sequence longer
than the model allows shows next to Run before anything loads. They read the same
numbers the preflight reads (``n_positions`` / ``max_position_embeddings`` of the
config), from the preset table or the folder's ``config.json``; the preflight still
runs at Run and stays the authority.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from engine.models.presets import did_you_mean, get_preset

POSITION_KEYS = ("n_positions", "max_position_embeddings")


def _limit(config: dict) -> int | None:
    for key in POSITION_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _hub_config(model: str) -> dict | None:
    """The cached config.json of a hub id, or None when it is not in the local cache."""
    from huggingface_hub import try_to_load_from_cache

    try:
        path = try_to_load_from_cache(model, "config.json")
    except ValueError:  # not a valid repo id
        return None
    if not isinstance(path, str):
        return None
    return json.loads(Path(path).read_text(encoding="utf-8"))


def check_model(model: str, seq_len: int, source: str = "auto") -> None:
    """Raise ``ValueError`` (with the CLI's flags) when ``model`` cannot run at ``seq_len``.

    ``source`` is "preset", "folder", "hub" or "auto" (decide as ``--model`` does).
    """
    model = model.strip()
    preset = get_preset(model) if source in ("preset", "auto") else None
    if preset is not None:
        config = preset.config
    elif source == "folder" or (source == "auto" and (
            Path(model).expanduser().exists() or model.startswith((".", "/", "~"))
            or os.sep in model.replace("/", ""))):
        folder = Path(model).expanduser()
        if not folder.is_dir():
            raise ValueError(f"model folder '{model}' does not exist: check the path (--model)")
        try:
            config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ValueError(f"folder '{model}' has no config.json: point --model at a "
                             "transformers model folder (one written by save_pretrained)") from None
        except (OSError, ValueError) as exc:
            raise ValueError(f"{folder / 'config.json'} cannot be read ({exc}): "
                             "check the model folder (--model)") from None
    else:
        config = _hub_config(model)
        if config is None:
            raise ValueError(f"'{model}' is not in the local hub cache (this machine is offline "
                             f"to the hub): download it first with 'hf download {model}', or "
                             f"pick a preset or a folder (--model){did_you_mean(model)}")
    limit = _limit(config) if isinstance(config, dict) else None
    if limit is not None and seq_len > limit:
        raise ValueError(f"sequence length {seq_len} is longer than {model} allows "
                         f"({limit} positions): set --seq-len {limit} or less")
