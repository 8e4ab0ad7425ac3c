"""Each matmul layer's quantisation error in a trial: the SQNR of its weight and input.

SQNR (dB) = 10 log10(sum x^2 / sum (x - q(x))^2), where q rounds x as the trial's recipe
does before its forward GEMM, through torchao's own casts: float8 tensorwise or rowwise
scaling from the layer's ``Float8LinearConfig`` (``hp_tensor_to_float8_dynamic``), MXFP8
32-element blocks with the layer's e8m0 scale mode (``MXTensor.to_mx``), NVFP4 16-element
blocks with an fp32 tensor scale (``NVFP4Tensor.to_nvfp4``; AmpScope's emulated NVFP4 layers
by their own quantiser, weights in 16 x 16 blocks); autocast's cast to bf16/fp16
for plain layers in an autocast region. The inputs come from forward pre-hooks on one
uncounted forward of the trial's first batch (no gradients), before the timed steps.
"""

from __future__ import annotations

import math
import statistics

import torch
from torch import nn

from engine.core.events import LayerSqnr, QuantError
from engine.core.recipes import MX_BLOCK, Recipe, autocast_for

METHOD = ("SQNR = 10 log10(sum x^2 / sum (x - q(x))^2) of each matmul layer's weight and "
          "input, q as the recipe rounds them before its forward GEMM (torchao's casts; "
          "autocast's for plain layers); inputs from one forward of the trial's first batch")
_HALF = {torch.bfloat16: "bf16", torch.float16: "fp16"}


OVERFLOWED = ("n/a: the tensor already held inf or NaN (an fp16 activation overflowed), "
              "so its rounding error is no number")
OUT_OF_RANGE = ("n/a: rounding to the format gave inf or NaN (values beyond its range), "
                "so the error is unbounded")


def sqnr(x: torch.Tensor, q: torch.Tensor) -> tuple[float | None, str | None]:
    """SQNR of ``q`` as a rounding of ``x`` in dB, summed in fp64, or None with the reason
    where it is no number (inf/NaN in ``x`` or in ``q``); None, None if ``q == x``."""
    x64 = x.detach().to(torch.float64)
    signal = x64.pow(2).sum().item()
    if not math.isfinite(signal):
        return None, OVERFLOWED
    noise = (x64 - q.detach().to(torch.float64)).pow(2).sum().item()
    if not math.isfinite(noise):
        return None, OUT_OF_RANGE
    if noise == 0.0:
        return None, None
    return 10.0 * math.log10(signal / noise), None


def sqnr_db(x: torch.Tensor, q: torch.Tensor) -> float | None:
    """``sqnr``'s dB alone."""
    return sqnr(x, q)[0]


def reason_none(rec: Recipe) -> str | None:
    """Why a recipe has no quantisation error to show (None: it has)."""
    if rec.quant:
        return f"not measured for {rec.quant} (bitsandbytes quantises inside its own kernels)"
    if rec.fp8 or rec.mx or rec.autocast_dtype is not None or rec.weight_dtype in _HALF:
        return None
    if rec.tf32:
        return "tf32 rounds inside the GEMM (not measured); its weights and inputs stay fp32"
    return "nothing is quantised: fp32 weights and inputs"


def _float8(module: nn.Module, role: str, x: torch.Tensor) -> torch.Tensor:
    """torchao's forward cast of a Float8Linear operand, dequantised (x: input or weight.t())."""
    from torchao.float8.float8_scaling_utils import (
        get_maybe_axiswise_dim,
        hp_tensor_to_float8_dynamic,
    )
    from torchao.float8.float8_training_tensor import GemmInputRole

    cfg = module.config
    cast = cfg.cast_config_input if role == "input" else cfg.cast_config_weight
    if cast.scaling_type.value == "disabled":
        return x
    gemm_role, dim = (GemmInputRole.INPUT, -1) if role == "input" else (GemmInputRole.WEIGHT, 0)
    fp8 = hp_tensor_to_float8_dynamic(
        x, cast.target_dtype, module.linear_mm_config, gemm_input_role=gemm_role,
        scaling_granularity=cast.scaling_granularity,
        axiswise_dim=get_maybe_axiswise_dim(dim, cast.scaling_granularity),
        round_scales_to_power_of_2=cfg.round_scales_to_power_of_2)
    # the GEMM multiplies the fp8 bits and divides by the scale in fp32: dequantising to a
    # bf16 input's own dtype would round a second time
    return fp8._data.to(torch.float32) / fp8._scale


def _float8_format(module: nn.Module) -> str:
    cfg = module.config
    # torchao calls one scale per row "axiswise"; the recipe is named rowwise
    grain = cfg.cast_config_input.scaling_granularity.value.replace("axiswise", "rowwise")
    dtype = str(cfg.cast_config_input.target_dtype).removeprefix("torch.float8_")
    power2 = ", power-of-2 scales" if cfg.round_scales_to_power_of_2 else ""
    return f"fp8 {dtype} {grain}{power2}"


def _mxfp8(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    from torchao.prototype.mx_formats.mx_tensor import MXTensor

    flat = x.reshape(-1, x.shape[-1])  # blocks run along the reduced (last) dimension
    mx = MXTensor.to_mx(flat, torch.float8_e4m3fn, MX_BLOCK, module.scale_calculation_mode)
    return mx.dequantize(torch.float32).reshape(x.shape)


def _nvfp4(x: torch.Tensor) -> torch.Tensor:
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale

    flat = x.reshape(-1, x.shape[-1])
    scale = per_tensor_amax_to_scale(flat.abs().max().to(torch.float32))
    q = NVFP4Tensor.to_nvfp4(flat, per_tensor_scale=scale)
    return q.dequantize(torch.float32).reshape(x.shape)


def _nvfp4_emulated_weight(w: torch.Tensor) -> torch.Tensor:
    from engine.measure.nvfp4_linear import WEIGHT_ROWS
    from engine.measure.nvfp4_quant import fake_quantize

    return fake_quantize(w, WEIGHT_ROWS)


def _nvfp4_emulated_input(x: torch.Tensor) -> torch.Tensor:
    from engine.measure.nvfp4_quant import fake_quantize

    return fake_quantize(x.reshape(-1, x.shape[-1])).reshape(x.shape)


def _unrounded(x: torch.Tensor) -> torch.Tensor:
    return x


def _layer(module: nn.Module, autocast: torch.dtype | None):
    """(format, q_weight(w), q_input(x), the weight as the GEMM reads it) for a matmul
    layer, or None for a module that is none (or one this measure does not read)."""
    kind = type(module).__name__
    if kind == "Float8Linear":
        return (_float8_format(module), lambda w: _float8(module, "weight", w.t()).t(),
                lambda x: _float8(module, "input", x))
    if kind == "MXFP8Linear":
        mode = module.scale_calculation_mode.value.upper()
        return (f"mxfp8 e4m3, e8m0 scale per {MX_BLOCK} ({mode})",
                lambda w: _mxfp8(module, w), lambda x: _mxfp8(module, x))
    if kind == "NVFP4Linear":
        return "nvfp4 e2m1, e4m3 scale per 16, fp32 tensor scale", _nvfp4, _nvfp4
    if kind == "EmulatedNVFP4Linear":
        return ("nvfp4 e2m1, e4m3 scale per 16 (weights per 16x16), fp32 tensor scale, "
                "emulated", _nvfp4_emulated_weight, _nvfp4_emulated_input)
    if type(module) is nn.Linear or kind == "Conv1D":  # Conv1D: GPT-2's (in, out) layers
        if autocast is not None:
            name = f"{_HALF[autocast]} cast (autocast)"
            return name, (lambda w: w.to(autocast)), (lambda x: x.to(autocast))
        if module.weight.dtype in _HALF:
            # stored in the half dtype: the GEMM rounds nothing more
            return f"{_HALF[module.weight.dtype]} (stored)", _unrounded, _unrounded
    return None


def measure(model: nn.Module, rec: Recipe, batch: dict, device: torch.device) -> QuantError:
    """One forward of ``batch`` under the recipe, each matmul layer's input SQNR taken in
    a forward pre-hook (registered last, so it sees what the layer's GEMM casts)."""
    autocast = rec.autocast_dtype
    rows: dict[str, LayerSqnr] = {}
    hooks = []

    def hook_for(name: str, module: nn.Module, spec):
        fmt, q_weight, q_input = spec

        def pre_hook(_module, args):
            x = args[0]
            if autocast is not None and x.is_floating_point() and \
                    type(module).__name__ == "Float8Linear":
                x = x.to(autocast)  # Float8Linear casts its input to the autocast dtype first
            w = module.weight
            (w_db, w_why), (x_db, x_why) = sqnr(w, q_weight(w)), sqnr(x, q_input(x))
            why = "; ".join(f"{role} {text}" for role, text in (("weight", w_why),
                                                                 ("input", x_why)) if text)
            rows[name] = LayerSqnr(name, fmt, w_db, x_db, why or None)
        return pre_hook

    for name, module in model.named_modules():
        spec = _layer(module, autocast)
        if spec is not None:
            hooks.append(module.register_forward_pre_hook(hook_for(name, module, spec)))
    try:
        with torch.no_grad(), autocast_for(rec, device):
            model(**batch)
    finally:
        for h in hooks:
            h.remove()
    layers = list(rows.values())

    def stats(values) -> tuple[float | None, float | None]:
        finite = [v for v in values if v is not None]
        return (statistics.median(finite), min(finite)) if finite else (None, None)

    w_med, w_min = stats(r.weight_db for r in layers)
    i_med, i_min = stats(r.input_db for r in layers)
    na = [r.name for r in layers if r.reason]
    reason = (f"{len(na)} layer(s) n/a, left out of the median and worst ({', '.join(na[:3])}"
              f"{', ...' if len(na) > 3 else ''}): {next(r.reason for r in layers if r.reason)}"
              if na else None)
    return QuantError(METHOD, layers, w_med, w_min, i_med, i_min, reason)
