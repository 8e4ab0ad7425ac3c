"""Built-in models: transformers configs that build with random weights, no download."""

from __future__ import annotations

import difflib
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
def _data() -> dict:
    return json.loads((RESOURCES / "presets.json").read_text(encoding="utf-8"))


@cache
def presets() -> tuple[Preset, ...]:
    return tuple(Preset(**item) for item in _data()["presets"])


@cache
def aliases() -> dict[str, str]:
    """Other spellings users type (``llama2-7b``, ``gpt2-small``), lower-cased, to the
    preset's name."""
    return {k.lower(): v for k, v in _data().get("aliases", {}).items()}


def get_preset(name: str) -> Preset | None:
    """The preset ``name`` names: its own name or an alias, in any case."""
    key = name.strip().lower()
    key = aliases().get(key, key)
    return next((p for p in presets() if p.name.lower() == key), None)


def did_you_mean(name: str) -> str:
    """'; did you mean X or Y?' for presets whose names (or aliases) are close to ``name``;
    empty when none is."""
    key = name.strip().lower()
    choices = {p.name.lower(): p.name for p in presets()} | aliases()
    close = dict.fromkeys(choices[c] for c in difflib.get_close_matches(
        key, list(choices), n=6, cutoff=0.75))
    if not close:
        return ""
    *rest, last = list(close)[:3]
    return f"; did you mean {', '.join(rest) + ' or ' if rest else ''}{last}?"


@cache
def param_count(name: str) -> int:
    """Exact parameter count, without building the whole model: the preset's model with one
    and with two layers, on the meta device (no memory, no init), and the difference (one
    layer) times the rest. Every preset stacks identical layers (``num_hidden_layers`` of
    one block type); building all 80 of Llama 3 70B's took seconds each on a busy machine.
    ``built_param_count`` builds the whole model: tests check the two agree."""
    config = get_preset(name).build_config()
    layers = int(config.num_hidden_layers)
    one = _count_with_layers(name, 1)
    if layers == 1:
        return one
    return one + (layers - 1) * (_count_with_layers(name, 2) - one)


def _count_with_layers(name: str, layers: int) -> int:
    config = get_preset(name).build_config()
    config.num_hidden_layers = layers
    if isinstance(getattr(config, "layer_types", None), list):  # per-layer attention kinds
        config.layer_types = config.layer_types[:layers]
    return _meta_count(get_preset(name).task, config)


def built_param_count(name: str) -> int:
    """Exact parameter count, from the whole model built on the meta device."""
    return _meta_count(get_preset(name).task, get_preset(name).build_config())


def _meta_count(task: str, config) -> int:
    import torch

    from engine.models.hf import model_class

    with torch.device("meta"):
        model = model_class(task).from_config(config)
    return sum(p.numel() for p in model.parameters())
