"""One recipe per precision: how weights are stored, what autocast runs, what scales.

A recipe is data; ``engine.models`` loads a model by it and ``engine.trial`` trains
by it. ``peak_dtype`` names the column of the peak FLOP/s table that MFU divides by:
the dtype the recipe's matmuls actually run in.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

from engine.config import PRECISIONS


@dataclass(frozen=True)
class Recipe:
    precision: str
    weight_dtype: torch.dtype  # dtype of the (non-quantised) weights as loaded
    autocast_dtype: torch.dtype | None  # None: no autocast region
    use_scaler: bool  # GradScaler (dynamic loss scaling)
    quant: str | None  # None, "int8" or "nf4" (bitsandbytes)
    lora: bool  # base frozen, peft LoRA adapters trained
    fp8: bool  # torchao float8 training
    tf32: bool  # allow TF32 matmuls
    peak_dtype: str  # key into resources/peak_flops.json
    master_weights: bool  # fp32 master copy kept by the optimiser path
    description: str


_F32, _F16, _BF16 = torch.float32, torch.float16, torch.bfloat16

RECIPES: dict[str, Recipe] = {
    r.precision: r
    for r in (
        Recipe("fp32", _F32, None, False, None, False, False, False, "fp32", False,
               "fp32 weights and math; TF32 off"),
        Recipe("tf32", _F32, None, False, None, False, False, True, "tf32", False,
               "fp32 weights; matmuls in TF32 on Tensor Cores"),
        Recipe("fp16-amp", _F32, _F16, True, None, False, False, False, "fp16", True,
               "fp32 master weights, autocast fp16, GradScaler"),
        Recipe("bf16-amp", _F32, _BF16, False, None, False, False, False, "bf16", True,
               "fp32 master weights, autocast bf16, no loss scaling"),
        Recipe("fp16", _F16, None, True, None, False, False, False, "fp16", False,
               "pure fp16 weights, gradients and optimiser state, GradScaler"),
        Recipe("bf16", _BF16, None, False, None, False, False, False, "bf16", False,
               "pure bf16 weights, gradients and optimiser state"),
        Recipe("int8", _F16, _F16, False, "int8", True, False, False, "fp16", False,
               "bitsandbytes LLM.int8 frozen base (fp16 elsewhere), LoRA adapters trained; "
               "MFU against the fp16 peak: backward and outliers run in fp16"),
        Recipe("nf4", _BF16, _BF16, False, "nf4", True, False, False, "bf16", False,
               "bitsandbytes 4-bit NF4 frozen base, bf16 compute, LoRA adapters (QLoRA)"),
        Recipe("fp8", _F32, _BF16, False, None, False, True, False, "fp8", True,
               "torchao float8 training of Linear layers, bf16 autocast elsewhere"),
    )
}

assert tuple(RECIPES) == PRECISIONS


def recipe(precision: str) -> Recipe:
    try:
        return RECIPES[precision]
    except KeyError:
        raise ValueError(
            f"unknown precision '{precision}': choose from {', '.join(PRECISIONS)}"
        ) from None


def autocast_for(rec: Recipe, device: torch.device):
    """The recipe's autocast region on ``device`` (a no-op for recipes without one)."""
    if rec.autocast_dtype is None:
        return nullcontext()
    return torch.autocast(device.type, dtype=rec.autocast_dtype)
