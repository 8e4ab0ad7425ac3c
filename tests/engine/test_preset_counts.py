"""`presets` counts parameters from a one- and a two-layer build, not the whole model: the
count equals the whole model's, and GPT-2's closed form."""

from __future__ import annotations

import pytest

from engine.models.presets import built_param_count, param_count


def gpt2_params(layers: int, width: int, vocab: int = 50257, positions: int = 1024) -> int:
    """GPT-2 by hand: token and position embeddings, per block two LayerNorms (2·2d), the
    fused qkv (d·3d + 3d), the attention output (d² + d) and the MLP (d·4d + 4d, 4d·d + d):
    12d² + 13d; the final LayerNorm (2d); the LM head is tied to the token embedding."""
    d = width
    return vocab * d + positions * d + layers * (12 * d * d + 13 * d) + 2 * d


@pytest.mark.parametrize(("name", "layers", "width"), [("gpt2", 12, 768), ("gpt2-xl", 48, 1600)])
def test_gpt2_counts_match_the_closed_form(name, layers, width):
    assert param_count(name) == gpt2_params(layers, width)


@pytest.mark.parametrize("name", ["tiny", "llama-1b", "gemma-2-9b", "phi-3-mini", "bert-base"])
def test_counts_equal_the_whole_models_on_the_meta_device(name):
    assert param_count(name) == built_param_count(name)
