"""What ``--model`` names: a preset, a local model folder or a hub id.

Kept apart from the loader (engine.models.load imports torch) so that a command refuses
a wrong ``--model`` before seconds of imports.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from engine.models.presets import get_preset

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "preset", "folder" or "hub"
    ref: str  # preset name, absolute folder path or hub id

    @property
    def has_weights(self) -> bool:
        if self.kind == "folder":
            return any((Path(self.ref) / f).exists() for f in WEIGHT_FILES)
        return self.kind == "hub"


def resolve_source(text: str) -> ModelSource:
    """Decide what ``--model`` names. Raises ``ValueError`` saying what to pass instead."""
    text = text.strip()
    if get_preset(text) is not None:  # an alias ("llama2-7b") resolves to the preset's name
        return ModelSource("preset", get_preset(text).name)
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(
                f"folder '{text}' has no config.json: point --model at a transformers "
                "model folder (one written by save_pretrained)"
            )
        return ModelSource("folder", str(path.resolve()))
    if path.exists():
        raise ValueError(f"'{text}' is a file, not a model folder: pass the folder that holds it")
    looks_like_path = text.startswith((".", "/", "~")) or os.sep in text.replace("/", "")
    if looks_like_path or not _HUB_ID.match(text):
        raise ValueError(
            f"model folder '{text}' does not exist: check the path, or pick a preset "
            "(python main.py presets)"
        )
    return ModelSource("hub", text)
