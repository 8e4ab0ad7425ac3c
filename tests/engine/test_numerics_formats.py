import math

import pytest
import torch

from engine.numerics.formats import format_table, representable_range_log2

FLOAT_DTYPES = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def _by_name():
    return {f.name: f for f in format_table()}


def _stored(value: float, dtype: torch.dtype) -> float:
    return torch.tensor(value, dtype=torch.float64).to(dtype).double().item()


@pytest.mark.parametrize("name", list(FLOAT_DTYPES))
def test_float_formats_match_finfo(name):
    info, fi = _by_name()[name], torch.finfo(FLOAT_DTYPES[name])
    assert info.bits == fi.bits
    assert info.max == fi.max
    assert info.min_normal == fi.smallest_normal
    assert info.eps == fi.eps
    assert info.sign_bits + info.exponent_bits + info.mantissa_bits == fi.bits
    assert info.decimal_digits == pytest.approx(-math.log10(fi.eps))


@pytest.mark.parametrize("name", list(FLOAT_DTYPES))
def test_mantissa_bits_and_smallest_subnormal_by_rounding(name):
    info, dtype = _by_name()[name], FLOAT_DTYPES[name]
    m = info.mantissa_bits
    assert _stored(1 + 2.0**-m, dtype) == 1 + 2.0**-m
    assert _stored(1 + 2.0**-(m + 1), dtype) == 1.0  # a tie rounds to the even 1.0
    assert _stored(info.min_subnormal, dtype) == info.min_subnormal
    assert _stored(info.min_subnormal / 2, dtype) == 0.0


def test_tf32_is_a_mode_with_fp32_range_and_10_bit_mantissa():
    tf32, fp32 = _by_name()["tf32"], torch.finfo(torch.float32)
    assert tf32.kind == "matmul-mode" and tf32.torch_dtype is None
    assert (tf32.exponent_bits, tf32.mantissa_bits, tf32.bits) == (8, 10, 19)
    assert tf32.eps == 2.0**-10
    assert tf32.min_normal == fp32.smallest_normal
    assert fp32.max * (1 - 2.0**-10) < tf32.max < fp32.max


def test_int8_from_iinfo():
    int8 = _by_name()["int8"]
    assert int8.max == torch.iinfo(torch.int8).max
    assert int8.eps == pytest.approx(1 / torch.iinfo(torch.int8).max)


def test_nf4_codebook_is_what_bitsandbytes_dequantises_to():
    from bitsandbytes.functional import dequantize_4bit, quantize_4bit

    nf4 = _by_name()["nf4"]
    codes = torch.tensor(nf4.codebook)
    assert len(codes) == 16 and 0.0 in nf4.codebook and nf4.max == 1.0
    weights = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    packed, state = quantize_4bit(weights.flatten(), quant_type="nf4", blocksize=64)
    normalised = dequantize_4bit(packed, state).reshape(4, 64) / state.absmax[:, None]
    distance = (normalised[..., None] - codes).abs().min(dim=-1).values
    assert distance.max() < 1e-3
    assert nf4.min_subnormal == min(abs(c) for c in nf4.codebook if c != 0)


def test_range_log2_of_fp16():
    lo, hi = representable_range_log2(_by_name()["fp16"])
    assert lo == -24
    assert hi == pytest.approx(math.log2(65504))
