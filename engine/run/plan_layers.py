"""Which of a model's layers repeat, and the same model cut to fewer repeats.

A decoder's layers are alike up to what its config says differs per layer: a per-layer
list (``layer_types``: local or global attention), the indices of layers without experts
(``mlp_only_layers``), leading dense layers (``first_k_dense_replace``) or a sparse step
(``decoder_sparse_step``, ``moe_layer_freq``). Each layer gets a kind from these; the kinds
are a prefix that does not repeat followed by a period that does. The plan traces the
model cut to the prefix, a few periods and the remainder (engine.run.plan_scale), which
keeps every kind of layer and the order they come in.

An encoder-decoder with as many encoder as decoder layers repeats (encoder layer, decoder
layer) pairs: both counts are cut together. A config whose layer count is not an int, or
whose layers differ in a way this module does not read, is not cut: the plan traces it
whole (its verdict says why).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

# per-layer settings read from a config that are not a list as long as the layers
_SPARSE_STEPS = ("decoder_sparse_step", "moe_layer_freq", "interleave_moe_layer_step")
MAX_PERIOD = 16  # longer periods than any published pattern are traced whole


@dataclass(frozen=True)
class LayerPattern:
    layers: int  # the model's layer count (encoder-decoder: per stack)
    prefix: int  # leading layers that do not repeat
    period: int  # layers in one repeat
    repeats: int  # whole periods after the prefix
    encoder_decoder: bool = False

    def cut_layers(self, repeats: int) -> int:
        """The layer count of the model cut to ``repeats`` periods (remainder kept)."""
        return self.layers - (self.repeats - repeats) * self.period

    def describe(self) -> str:
        kind = " (encoder and decoder layers cut together)" if self.encoder_decoder else ""
        head = f"{self.prefix} leading layer{'s' * (self.prefix != 1)} and " \
            if self.prefix else ""
        return (f"{head}{self.repeats} repeats of {self.period} layer"
                f"{'s' * (self.period != 1)}{kind}")


def _count(config) -> int | None:
    layers = getattr(config, "num_hidden_layers", None)
    return layers if isinstance(layers, int) and not isinstance(layers, bool) else None


def _per_layer_lists(config, layers: int) -> list[str]:
    """Config attributes that are lists with one entry per layer."""
    return [k for k, v in vars(config).items()
            if isinstance(v, (list, tuple)) and len(v) == layers and not k.startswith("_")]


def layer_kinds(config, layers: int) -> list[tuple]:
    """One hashable kind per layer: everything the config says about that layer alone."""
    lists = _per_layer_lists(config, layers)
    dense_only = set(getattr(config, "mlp_only_layers", None) or ())
    first_dense = getattr(config, "first_k_dense_replace", None) or 0
    steps = {name: getattr(config, name) for name in _SPARSE_STEPS
             if isinstance(getattr(config, name, None), int)
             and not isinstance(getattr(config, name), bool) and getattr(config, name) > 0}
    kinds = []
    for i in range(layers):
        kind = [(name, str(getattr(config, name)[i])) for name in lists]
        kind += [("dense", i in dense_only or i < first_dense)]
        kind += [(name, (i + 1) % step if name == "decoder_sparse_step" else i % step)
                 for name, step in steps.items()]
        kinds.append(tuple(kind))
    return kinds


def find_pattern(config, samples: int = 3) -> tuple[LayerPattern | None, str]:
    """The cheapest (prefix, period) whose repeats explain the layer kinds, with more
    repeats than ``samples`` (else tracing the whole model costs as much); None and why."""
    layers = _count(config)
    if layers is None:
        return None, "the config gives no layer count (num_hidden_layers)"
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    if encoder_decoder:
        decoder = getattr(config, "num_decoder_layers", layers)
        if decoder != layers:
            return None, (f"its encoder has {layers} layers and its decoder {decoder}: only "
                          "equal stacks are cut together")
    kinds = layer_kinds(config, layers)
    best = None
    for period in range(1, min(MAX_PERIOD, layers // (samples + 1)) + 1):
        if best is not None and best[0] <= samples * period:  # no longer period is cheaper
            break
        prefix = layers - period  # walk back while each layer matches the one a period on
        while prefix > 0 and kinds[prefix - 1] == kinds[prefix - 1 + period]:
            prefix -= 1
        repeats = (layers - prefix) // period
        cost = prefix + samples * period
        if repeats > samples and (best is None or cost < best[0]):
            best = (cost, LayerPattern(layers, prefix, period, repeats, encoder_decoder))
    if best is None:
        return None, (f"its {layers} layers do not repeat more than {samples} times: it is "
                      "traced whole")
    return best[1], ""


def cut_config(config, pattern: LayerPattern, repeats: int):
    """A copy of ``config`` with ``repeats`` periods; per-layer settings cut to match."""
    layers = pattern.cut_layers(repeats)
    cut = copy.deepcopy(config)
    for name in _per_layer_lists(config, pattern.layers):
        setattr(cut, name, list(getattr(config, name))[:layers])
    if getattr(config, "mlp_only_layers", None):
        cut.mlp_only_layers = [i for i in config.mlp_only_layers if i < layers]
    cut.num_hidden_layers = layers
    if pattern.encoder_decoder and hasattr(config, "num_decoder_layers"):
        cut.num_decoder_layers = layers
    return cut
