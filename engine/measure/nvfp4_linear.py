"""Emulated NVFP4 training of a Linear layer, for devices without FP4 Tensor Cores.

Each of the three GEMMs multiplies, in fp32, operands quantised and dequantised as the
native recipe quantises them (engine/measure/nvfp4_quant.py: Transformer Engine's
reference NVFP4 recipe, with its stochastic rounding of gradients):

- output ``y = x W^T``: x in 1 x 16 blocks, W in 16 x 16 blocks, both to nearest;
- input gradient ``dx = dy W``: dy in 1 x 16 blocks, stochastically rounded; W as above;
- weight gradient ``dW = dy^T x`` (reduced over tokens): dy^T and x^T, each Hadamard-
  rotated along the tokens (zero-padded to a multiple of 16), in 1 x 16 blocks; dy^T
  stochastically rounded, x^T to nearest.

Stochastic rounding draws from the layer's own generator (one per model, seeded), never
from torch's global one, so dropout and the data order draw exactly what they draw in the
other recipes' trials, and an nvfp4 trial differs from them only by its format. It draws
in this order each backward: dgrad's dy, then wgrad's rotated dy^T.

The GEMMs run through ``ampscope::emulated_mm``, a custom op that FlopCounterMode counts
and engine/measure/flops.py files under the format the card would run ("nvfp4"), not the
fp32 the emulation multiplies in. The output is cast to the autocast dtype, as the native
GEMM writes bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.measure.nvfp4_quant import BLOCK, fake_quantize, rotate

FORMAT = "nvfp4"
WEIGHT_ROWS = 16  # 16 x 16 weight blocks


@torch.library.custom_op("ampscope::emulated_mm", mutates_args=())
def emulated_mm(a: torch.Tensor, b: torch.Tensor, fmt: str) -> torch.Tensor:
    """``a @ b`` of dequantised ``fmt`` operands (``fmt`` names what the card would run)."""
    return a @ b


@emulated_mm.register_fake
def _(a: torch.Tensor, b: torch.Tensor, fmt: str) -> torch.Tensor:
    return a.new_empty(a.shape[0], b.shape[1])


def _tokens_last(t: torch.Tensor) -> torch.Tensor:
    """(tokens, features) -> (features, tokens), tokens zero-padded to a multiple of 16
    (zeros add nothing to the weight gradient), then Hadamard-rotated along the tokens."""
    t = t.t()
    pad = -t.shape[1] % BLOCK
    return rotate(F.pad(t, (0, pad)) if pad else t)


class _NVFP4Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, generator, out_dtype):
        flat = x.reshape(-1, x.shape[-1]).to(torch.float32)
        wq = fake_quantize(weight, WEIGHT_ROWS)
        y = emulated_mm(fake_quantize(flat, 1), wq.t(), FORMAT)
        if bias is not None:
            y = y + bias.to(torch.float32)
        ctx.save_for_backward(flat, wq)
        ctx.generator, ctx.x_shape, ctx.x_dtype = generator, x.shape, x.dtype
        ctx.w_dtype, ctx.has_bias = weight.dtype, bias is not None
        return y.reshape(*x.shape[:-1], -1).to(out_dtype)

    @staticmethod
    def backward(ctx, grad):
        flat, wq = ctx.saved_tensors
        dy = grad.reshape(-1, grad.shape[-1]).to(torch.float32)
        dyq = fake_quantize(dy, 1, ctx.generator)
        dx = emulated_mm(dyq, wq, FORMAT).reshape(ctx.x_shape).to(ctx.x_dtype)
        dy_t = fake_quantize(_tokens_last(dy), 1, ctx.generator)
        x_t = fake_quantize(_tokens_last(flat), 1)
        dw = emulated_mm(dy_t, x_t.t(), FORMAT).to(ctx.w_dtype)
        db = dy.sum(0).to(ctx.w_dtype) if ctx.has_bias else None
        return dx, dw, db, None, None


class EmulatedNVFP4Linear(nn.Linear):
    """An ``nn.Linear`` whose forward and backward GEMMs are emulated NVFP4 (module doc).
    Both dimensions must be multiples of 16; the weight and bias are the original
    layer's (fp32 master weights, as the native recipe keeps)."""

    def __init__(self, linear: nn.Linear, generator: torch.Generator):
        super().__init__(linear.in_features, linear.out_features, linear.bias is not None,
                         device="meta")
        if linear.in_features % BLOCK or linear.out_features % BLOCK:
            raise ValueError(f"NVFP4 needs both Linear dimensions to be multiples of {BLOCK}, "
                             f"not {linear.in_features} x {linear.out_features}")
        self.weight, self.bias = linear.weight, linear.bias
        self.generator = generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kind = x.device.type
        out = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype
        with torch.autocast(kind, enabled=False):  # the GEMMs multiply dequantised fp32
            return _NVFP4Matmul.apply(x, self.weight, self.bias, self.generator, out)


def convert(model: nn.Module, keep, seed: int) -> int:
    """Swap the Linear layers ``keep(module, name)`` picks for emulated NVFP4 ones, all
    sharing one stochastic-rounding generator seeded with ``seed``; returns how many."""
    swaps = [(n, m) for n, m in model.named_modules() if keep(m, n)]
    if not swaps:
        return 0
    device = swaps[0][1].weight.device
    generator = torch.Generator(device=device).manual_seed(seed)
    for name, linear in swaps:
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child,
                EmulatedNVFP4Linear(linear, generator))
    return len(swaps)
