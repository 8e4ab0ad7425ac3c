"""Autocast's weight copies in the memory model for float8/MX recipes and their per-layer
variants: a layer torchao converts keeps no low-precision copy for backward (it saves the
fp32 weight and casts it again), so only the layers it leaves alone (the LM head, shapes the
format cannot take, the ":keep-..." layers) are copied. Against the tracker's measurement
at backward's start in real CPU trials, and against a count written here from each model's
shapes and the formats' rules."""

from __future__ import annotations

import re

import pytest
import transformers as tf
from torch import nn
from transformers.pytorch_utils import Conv1D

from engine.core.config import RunConfig
from engine.measure.device import probe
from engine.run.trial import run_trial

CPU = probe("cpu")
LAYERS = 3  # a middle block, so keep-ends leaves something converted
FAMILIES = {  # hidden 64, MLP 96: fp8 (x16) converts the MLP, MXFP8 (x32) too, q/k/v 64 / 32
    "gpt2": (tf.GPT2Config(n_embd=64, n_layer=LAYERS, n_head=4, n_inner=96, vocab_size=256,
                           n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
             tf.GPT2LMHeadModel, r"transformer\.h\.(\d+)\.", "attn"),
    "llama": (tf.LlamaConfig(hidden_size=64, intermediate_size=80, num_hidden_layers=LAYERS,
                             num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                             max_position_embeddings=64),
              tf.LlamaForCausalLM, r"model\.layers\.(\d+)\.", "self_attn"),
}
MULTIPLE = {"fp8": 16, "mxfp8": 32}


def _copied_weights(model_class, config, precision: str) -> int:
    """Matmul weights autocast copies: those of the layers the recipe leaves unconverted."""
    base, _, keep = precision.partition(":")
    _, _, block_re, attn = next(f for f in FAMILIES.values() if f[1] is model_class)
    copied = 0
    for name, m in model_class(config).named_modules():
        if isinstance(m, nn.Linear):
            n_in, n_out = m.in_features, m.out_features
        elif isinstance(m, Conv1D):
            n_in, n_out = m.nx, m.nf
        else:
            continue
        block = re.match(block_re, name)
        kept = (keep == "keep-ends" and block and int(block.group(1)) in (0, LAYERS - 1)) or \
            (keep == "keep-attn" and attn in name.split("."))
        converted = (not kept and name != "lm_head" and n_in % MULTIPLE[base] == 0
                     and n_out % MULTIPLE[base] == 0)
        copied += 0 if converted else n_in * n_out
    return copied


@pytest.mark.parametrize("precision", ["fp8", "mxfp8", "fp8:keep-ends", "fp8:keep-attn"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_weight_copies_leave_out_the_converted_layers(tmp_path, family, precision):
    config, model_class, _, _ = FAMILIES[family]
    config.save_pretrained(tmp_path)
    run = RunConfig(model=str(tmp_path), precisions=(precision,), batch_size=2, seq_len=32,
                    steps=1, warmup=0, device="cpu", isolation="inline", profile_step=False)
    result = run_trial(run, precision, CPU, lambda e: None, lambda: False)
    assert result.status == "ok", result.reason
    expected = 2 * _copied_weights(model_class, config, precision)  # bf16 copies
    assert result.memory.at_phase_start_bytes["backward"]["weight_copies"] == expected
    assert result.predicted_memory.weight_copies_bytes == expected
    assert result.predicted_memory.error_pct["weight_copies"] == 0.0
