"""Whether torchao's rowwise float8 training runs on this torch's CPU, found as a user meets
it: a forward and backward of one converted Linear under bf16 autocast (torch 2.11's CPU
``_scaled_mm`` takes per-tensor scales only; 2.13's takes row scales too)."""

from __future__ import annotations

import functools

import torch


@functools.cache
def rowwise_runs_on_cpu() -> bool:
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    torch.manual_seed(0)
    model = convert_to_float8_training(
        torch.nn.Sequential(torch.nn.Linear(32, 32)),
        config=Float8LinearConfig.from_recipe_name("rowwise"))
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(torch.randn(16, 32)).float().sum().backward()
    except RuntimeError:
        return False
    return True
