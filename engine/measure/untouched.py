"""Untimed measurements leave a trial as they found it (DESIGN 23).

Two things change behind a measurement's back. The RNG: a training-mode forward draws
dropout masks from it, so a measurement before a step would give that step other masks
than the user's loop. And bitsandbytes' 4-bit layers: where the CPU has AVX512-BF16, the
first eval-mode forward without gradients converts their weights for good into a CPU
inference layout (bitsandbytes 0.50 ``Linear4bit.forward``); later training steps then
run ``gemv_4bit``, which has no backward to its input, and LoRA adapters below the layer
get no gradient. Here the layers are told for the measurement's duration that the CPU has
no such path, so they run the same kernels as in training. Emulated NVFP4 layers round
gradients stochastically from a generator of their own (engine/measure/nvfp4_linear.py):
a measurement's backward would draw from it, so its state is put back too.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

CPU_LAYOUT_FLAG = "support_avx512bf16_for_cpu"  # bitsandbytes' per-layer CPU-feature choice


@contextmanager
def untouched(model: nn.Module, device: torch.device):
    """The RNGs as they were before, and 4-bit weights in their training layout, after the
    block."""
    layers = [m for m in model.modules() if getattr(m, CPU_LAYOUT_FLAG, False)]
    for layer in layers:
        setattr(layer, CPU_LAYOUT_FLAG, False)
    biases = [(m.bias, m.bias.data) for m in model.modules()
              if type(m).__module__.startswith("bitsandbytes")
              and isinstance(getattr(m, "bias", None), torch.Tensor)]
    generators = {id(g): g for m in model.modules()
                  if isinstance(g := getattr(m, "generator", None), torch.Generator)}
    states = [(g, g.get_state()) for g in generators.values()]
    cuda = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=cuda, device_type="cuda"):
            yield
    finally:
        for layer in layers:
            setattr(layer, CPU_LAYOUT_FLAG, True)
        for bias, data in biases:
            bias.data = data
        for generator, state in states:
            generator.set_state(state)
