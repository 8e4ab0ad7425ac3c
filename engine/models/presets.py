"""Built-in models: transformers configs that build with random weights, no download."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache

from engine.core.resources import RESOURCES


@dataclass(frozen=True)
class Preset:
    name: str
    task: str  # "causal-lm", "masked-lm" or "seq2seq-lm"
    description: str
    config: dict  # kwargs for transformers.AutoConfig.for_model

    def build_config(self):
        from engine.models.hf import auto_config

        kwargs = dict(self.config)
        return auto_config().for_model(kwargs.pop("model_type"), **kwargs)


@cache
def presets() -> tuple[Preset, ...]:
    data = json.loads((RESOURCES / "presets.json").read_text(encoding="utf-8"))
    return tuple(Preset(**item) for item in data["presets"])


def get_preset(name: str) -> Preset | None:
    return next((p for p in presets() if p.name == name), None)


@cache
def param_count(name: str) -> int:
    """Exact parameter count, from a model built on the meta device (no memory, no init)."""
    import torch

    from engine.models.hf import model_class

    preset = get_preset(name)
    config = preset.build_config()
    with torch.device("meta"):
        model = model_class(preset.task).from_config(config)
    return sum(p.numel() for p in model.parameters())
