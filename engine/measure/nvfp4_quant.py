"""NVFP4 quantise-dequantise as the native training recipe does it, on any device.

Follows Transformer Engine's reference recipe, ``transformer_engine.pytorch.custom_recipes
.reference_nvfp4`` (``NVFP4QuantizerRef`` and ``nvfp4_ref_rht_2d_factory``, TE 2.20.0.dev0,
commit d0067d0): e2m1 elements, one e4m3 scale per block and one fp32 scale per tensor;
1 x 16 blocks for activations and gradients, 16 x 16 blocks for weights (so a weight and its
transpose quantise alike); a 16-point random Hadamard transform (Sylvester matrix, TE's fixed
sign vector, scaled by 1/4) on the weight-gradient GEMM's operands along the token
dimension. TE's reference rounds to nearest; its recipe (``NVFP4BlockScaling``) rounds
gradients stochastically, which ``stochastic`` does here with a generator of its own.

Scales use torchao's convention (``per_tensor_amax_to_scale``: amax / (448 * 6)), which is
TE's global encode scale inverted; the 1 x 16 round-to-nearest path is torchao's own
``NVFP4Tensor.to_nvfp4`` (torchao 0.18), and the others round with its e2m1 helpers.
"""

from __future__ import annotations

import torch
from torchao.prototype.mx_formats.constants import F4_E2M1_MAX, F8E4M3_MAX
from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, f32_to_f4_unpacked
from torchao.prototype.mx_formats.nvfp4_tensor import E4M3_EPS, NVFP4Tensor

BLOCK = 16  # NVFP4's block length (and the Hadamard transform's size)
# the e2m1 magnitudes, in order (stochastic rounding picks one of the two around a value)
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# TE reference_nvfp4.get_wgrad_sign_vector: the transform's fixed "random" signs
_RHT_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
# an all-zero tensor's amax, raised so its scale stays a normal fp32 (its blocks stay 0)
_AMAX_FLOOR = torch.finfo(torch.float32).tiny * F8E4M3_MAX * F4_E2M1_MAX


def tensor_scale(x: torch.Tensor) -> torch.Tensor:
    """The per-tensor fp32 scale: amax / (448 * 6), so the largest block scale is e4m3's max."""
    amax = x.detach().abs().amax().to(torch.float32).clamp_min(_AMAX_FLOOR)
    return amax / (F8E4M3_MAX * F4_E2M1_MAX)


def _block_scales(x: torch.Tensor, rows: int, scale: torch.Tensor) -> torch.Tensor:
    """Each element's e4m3 block scale (in units of the tensor scale, as fp32), for blocks
    of ``rows`` x 16 along the last dimension of the 2-D fp32 ``x``."""
    m, k = x.shape
    tiles = x.abs().reshape(m // rows, rows, k // BLOCK, BLOCK)
    amax = tiles.amax(dim=(1, 3), keepdim=True)  # one per rows x 16 tile
    block = (amax / F4_E2M1_MAX / scale).clamp(E4M3_EPS, F8E4M3_MAX).to(torch.float8_e4m3fn)
    return block.to(torch.float32).expand(-1, rows, -1, BLOCK).reshape(m, k)


def _round_stochastic(v: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``v`` (within +-6) to one of the two e2m1 values around it, the upper one with the
    probability of its distance from the lower (unbiased: E[q] = v)."""
    grid = torch.tensor(_E2M1, device=v.device)
    mag = v.abs()
    low_i = (torch.searchsorted(grid, mag, right=True) - 1).clamp(0, len(_E2M1) - 2)
    low, high = grid[low_i], grid[low_i + 1]
    up = torch.rand(v.shape, generator=generator, device=v.device) < (mag - low) / (high - low)
    return torch.where(up, high, low).copysign(v)


def fake_quantize(x: torch.Tensor, rows: int = 1,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """The fp32 values a GEMM reads from ``x`` (2-D, its last dimension the reduced one)
    quantised to NVFP4 in ``rows`` x 16 blocks: to nearest, or stochastically when a
    ``generator`` is given. ``rows`` must divide the first dimension, 16 the last."""
    x = x.detach().to(torch.float32).contiguous()
    scale = tensor_scale(x)
    if rows == 1 and generator is None:
        q = NVFP4Tensor.to_nvfp4(x, block_size=BLOCK, per_tensor_scale=scale)
        return q.dequantize(torch.float32)
    block = _block_scales(x, rows, scale)
    # torchao's (and its kernel's) order: x * ((1 / tensor scale) / block scale)
    scaled = (x * ((1.0 / scale) / block)).clamp(-F4_E2M1_MAX, F4_E2M1_MAX)
    if generator is None:
        q = f4_unpacked_to_f32(f32_to_f4_unpacked(scaled))
    else:
        q = _round_stochastic(scaled, generator)
    return q * (scale * block)  # NVFP4Tensor.dequantize's order


def rotate(x: torch.Tensor) -> torch.Tensor:
    """TE's random Hadamard transform of each 16-block along the last dimension of ``x``:
    ``block @ diag(signs) @ H16 / 4`` (Sylvester H16). It is orthogonal, so applied to both
    operands along a GEMM's reduced dimension it leaves their product alone. Done as a
    fast Walsh-Hadamard butterfly (adds, no matmul): the hardware fuses it into the cast, and
    FlopCounterMode must not file it as an fp32 GEMM."""
    signs = torch.tensor(_RHT_SIGNS, dtype=x.dtype, device=x.device)
    y = x.reshape(-1, BLOCK) * signs
    h = 1
    while h < BLOCK:  # pairs h apart become (a + b, a - b): H = [[H, H], [H, -H]]
        a, b = y.reshape(-1, BLOCK // (2 * h), 2, h).unbind(-2)
        y = torch.stack((a + b, a - b), dim=-2).reshape(-1, BLOCK)
        h *= 2
    return (y / BLOCK**0.5).reshape(x.shape)
