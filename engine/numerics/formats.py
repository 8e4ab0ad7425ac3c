"""The number formats mixed precision trades between, read from torch and bitsandbytes.

Every figure comes from ``torch.finfo`` / ``torch.iinfo`` (or the NF4 code book that
bitsandbytes quantises with), so the table shows what the installed libraries do.

``eps`` is the relative step: for floats ``finfo.eps`` (the gap between 1.0 and the next
value); for int8 and NF4, which store a code times a per-block absmax scale, the
coarsest gap between neighbouring codes divided by the largest code.
``decimal_digits`` is ``-log10(eps)``: how many significant decimal digits survive.

The block-scaled formats (MXFP8, NVFP4) store small elements and one scale per block:
their ``bits``, ``eps`` and bit split are the element's; ``max``/``min_normal``/
``min_subnormal`` multiply the element's by the scale's largest, smallest-normal and
smallest-positive values; FP4 E2M1 has no torch finfo, so its values are read from
torchao's own fp4 decoder.
"""

from __future__ import annotations

import math
from functools import cache

import torch

from engine.record.lab_results import FormatInfo


def _digits(eps: float) -> float:
    return -math.log10(eps)


def float_format(name: str, dtype: torch.dtype, note: str) -> FormatInfo:
    fi = torch.finfo(dtype)
    mantissa = round(-math.log2(fi.eps))
    return FormatInfo(
        name=name,
        kind="float",
        torch_dtype=str(dtype),
        bits=fi.bits,
        sign_bits=1,
        exponent_bits=fi.bits - 1 - mantissa,
        mantissa_bits=mantissa,
        max=float(fi.max),
        min_normal=float(fi.smallest_normal),
        # below the smallest normal the spacing stays at min_normal * eps
        min_subnormal=float(fi.smallest_normal * fi.eps),
        eps=float(fi.eps),
        decimal_digits=_digits(fi.eps),
        note=note,
    )


def tf32_format() -> FormatInfo:
    """TF32 keeps fp32's exponent and rounds the mantissa to 10 bits inside matmuls."""
    fp32 = torch.finfo(torch.float32)
    mantissa = 10
    exponent = fp32.bits - 1 - round(-math.log2(fp32.eps))
    eps = 2.0**-mantissa
    max_exp = math.floor(math.log2(fp32.max))
    return FormatInfo(
        name="tf32",
        kind="matmul-mode",
        torch_dtype=None,
        bits=1 + exponent + mantissa,
        sign_bits=1,
        exponent_bits=exponent,
        mantissa_bits=mantissa,
        max=(2.0 - eps) * 2.0**max_exp,
        min_normal=float(fp32.smallest_normal),
        min_subnormal=float(fp32.smallest_normal) * eps,
        eps=eps,
        decimal_digits=_digits(eps),
        note="a matmul mode of Ampere+ Tensor Cores, not a storage dtype: fp32 tensors in "
        "memory, inputs rounded to a 10-bit mantissa inside the matmul, fp32 accumulation",
    )


def int8_format() -> FormatInfo:
    ii = torch.iinfo(torch.int8)
    return FormatInfo(
        name="int8",
        kind="int",
        torch_dtype=str(torch.int8),
        bits=ii.bits,
        sign_bits=1,
        exponent_bits=0,
        mantissa_bits=ii.bits - 1,
        max=float(ii.max),
        min_normal=1.0,
        min_subnormal=1.0,
        eps=1.0 / ii.max,
        decimal_digits=_digits(1.0 / ii.max),
        note="integer grid: LLM.int8 stores round(w / absmax * 127) per row with the absmax "
        "kept aside, so the range moves with each row's scale; outliers stay fp16",
    )


def nf4_codebook() -> tuple[float, ...]:
    """The 16 NF4 values bitsandbytes quantises to (normalised to [-1, 1])."""
    from bitsandbytes.functional import get_4bit_type

    return tuple(float(v) for v in get_4bit_type("nf4", device="cpu").tolist())


def nf4_format() -> FormatInfo:
    note = (
        "4-bit index into a 16-value code book of normal-distribution quantiles; each "
        "block of 64 weights stores its absmax, and matmuls dequantise to bf16/fp16"
    )
    try:
        codes = sorted(nf4_codebook())
    except ImportError as exc:
        return FormatInfo("nf4", "codebook", None, 4, None, None, None, None, None, None, None,
                          None, f"n/a: bitsandbytes is not importable ({exc})")
    nonzero = [abs(c) for c in codes if c != 0]
    top = max(abs(c) for c in codes)
    step = max(b - a for a, b in zip(codes, codes[1:])) / top
    return FormatInfo(
        name="nf4",
        kind="codebook",
        torch_dtype=None,
        bits=4,
        sign_bits=None,
        exponent_bits=None,
        mantissa_bits=None,
        max=top,
        min_normal=min(nonzero),
        min_subnormal=min(nonzero),
        eps=step,
        decimal_digits=_digits(step),
        note=note,
        codebook=tuple(codes),
    )


def e2m1_values() -> tuple[float, ...]:
    """The 8 non-negative FP4 E2M1 values, as torchao decodes the 4-bit codes."""
    from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32

    return tuple(sorted({abs(v) for v in f4_unpacked_to_f32(
        torch.arange(16, dtype=torch.uint8)).tolist()}))


def _e2m1() -> dict:
    values = e2m1_values()
    positive = [v for v in values if v > 0]
    after_one = min(v for v in values if v > 1.0)
    eps = after_one - 1.0
    mantissa = round(-math.log2(eps))
    smallest = min(positive)
    # a subnormal has no implicit leading 1: below 2**mantissa * smallest all steps are equal
    return {"bits": 4, "exponent": 4 - 1 - mantissa, "mantissa": mantissa, "max": max(values),
            "min_normal": smallest * 2**mantissa, "min_subnormal": smallest, "eps": eps}


def _finfo(dtype: torch.dtype) -> dict:
    fi = torch.finfo(dtype)
    mantissa = round(-math.log2(fi.eps)) if fi.eps < 1 else 0
    return {"bits": fi.bits, "exponent": fi.bits - 1 - mantissa, "mantissa": mantissa,
            "max": float(fi.max), "min_normal": float(fi.smallest_normal),
            "min_subnormal": float(fi.smallest_normal * fi.eps) if mantissa else
            float(fi.smallest_normal), "eps": float(fi.eps)}


def block_format(name: str, element: dict, scale: dict, block: int, scale_name: str,
                 note: str) -> FormatInfo:
    return FormatInfo(
        name=name, kind="block-scaled", torch_dtype=None, bits=element["bits"], sign_bits=1,
        exponent_bits=element["exponent"], mantissa_bits=element["mantissa"],
        max=element["max"] * scale["max"],
        min_normal=element["min_normal"] * scale["min_normal"],
        min_subnormal=element["min_subnormal"] * scale["min_subnormal"],
        eps=element["eps"], decimal_digits=_digits(element["eps"]), note=note,
        block_size=block, scale_format=scale_name)


def mxfp8_format() -> FormatInfo:
    e8m0 = _finfo(torch.float8_e8m0fnu)  # powers of 2 only: no mantissa, no subnormals
    return block_format(
        "mxfp8", _finfo(torch.float8_e4m3fn), e8m0, 32, "e8m0",
        "OCP MX: e4m3 elements, one e8m0 (power-of-2) scale per 32-element block, 8.25 bits "
        "per value; each block keeps e4m3's 448/2^-9 span, the scale moves it over 2^+-127")


def nvfp4_format() -> FormatInfo:
    e4m3 = _finfo(torch.float8_e4m3fn)
    return block_format(
        "nvfp4", _e2m1(), e4m3, 16, "e4m3 + fp32 per tensor",
        "NVIDIA NVFP4: e2m1 elements (0, 0.5, 1, 1.5, 2, 3, 4, 6), one e4m3 scale per "
        "16-element block and one fp32 scale per tensor (amax / (6 x 448)), 4.5 bits per "
        "value; range figures are in units of that tensor scale")


def format_table() -> list[FormatInfo]:
    return list(_table())


@cache
def _table() -> tuple[FormatInfo, ...]:
    return (
        float_format("fp32", torch.float32, "IEEE single: the training reference"),
        tf32_format(),
        float_format("fp16", torch.float16,
                     "IEEE half: 5-bit exponent, so small gradients underflow without "
                     "loss scaling and values above max become inf"),
        float_format("bf16", torch.bfloat16,
                     "brain float: fp32's 8-bit exponent with a 7-bit mantissa; fp32's range, "
                     "so no loss scaling, but coarse steps"),
        float_format("fp8_e4m3", torch.float8_e4m3fn,
                     "fp8 for weights and activations (forward); no inf, NaN only"),
        float_format("fp8_e5m2", torch.float8_e5m2,
                     "fp8 with fp16's exponent range, for gradients (backward)"),
        int8_format(),
        nf4_format(),
        mxfp8_format(),
        nvfp4_format(),
    )


def format_by_name(name: str) -> FormatInfo:
    for info in _table():
        if info.name == name:
            return info
    raise ValueError(f"unknown format '{name}': choose from "
                     f"{', '.join(f.name for f in _table())}")


def representable_range_log2(info: FormatInfo) -> tuple[float, float] | None:
    """log2 of the smallest magnitude above zero and of the largest, for range charts."""
    if info.min_subnormal is None or info.max is None:
        return None
    return math.log2(info.min_subnormal), math.log2(info.max)
