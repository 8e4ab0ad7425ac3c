"""MXFP8 and NVFP4 in the numerics lab: the formats table's figures against values decoded
here from the bit layouts, and the block-outlier demo against a quantiser written here
(torch's own float8 cast and the E2M1 grid, not torchao's)."""

import math

import pytest
import torch

from engine.numerics.demos import run_demos
from engine.numerics.formats import format_table


def _decode(exp_bits: int, man_bits: int, bias: int, skip=()) -> list[float]:
    """Every non-negative value of a sign/exponent/mantissa layout (IEEE-style subnormals
    at exponent field 0), the codes in ``skip`` (NaN) left out."""
    values = []
    for code in range(2 ** (exp_bits + man_bits)):
        if code in skip:
            continue
        e, m = code >> man_bits, code & (2**man_bits - 1)
        if e == 0:
            values.append(2.0 ** (1 - bias) * m / 2**man_bits)
        else:
            values.append(2.0 ** (e - bias) * (1 + m / 2**man_bits))
    return values


def _figures(values: list[float], man_bits: int) -> dict:
    positive = sorted(v for v in values if v > 0)
    normal = min(v for v in positive if math.log2(v).is_integer() and v >= positive[0]
                 * 2**man_bits)
    return {"max": max(values), "min_normal": normal, "min_subnormal": positive[0]}


E4M3 = _figures(_decode(4, 3, 7, skip={0x7F}), 3)  # S.1111.111 is NaN: max 448
E2M1 = _figures(_decode(2, 1, 1), 1)
E8M0 = [2.0 ** (e - 127) for e in range(255)]  # exponent only; 0xFF is NaN


def test_bit_layouts_decode_to_the_known_constants():
    assert E4M3 == {"max": 448.0, "min_normal": 2.0**-6, "min_subnormal": 2.0**-9}
    assert E2M1 == {"max": 6.0, "min_normal": 1.0, "min_subnormal": 0.5}
    assert (min(E8M0), max(E8M0)) == (2.0**-127, 2.0**127)


@pytest.mark.parametrize(("name", "element", "sem", "eps", "block", "scale"), [
    # the e8m0 scale has no subnormals: its smallest value is also its smallest normal
    ("mxfp8", E4M3, (1, 4, 3), 2.0**-3, 32, {"max": max(E8M0), "min_normal": min(E8M0),
                                             "min_subnormal": min(E8M0)}),
    ("nvfp4", E2M1, (1, 2, 1), 2.0**-1, 16, E4M3),
])
def test_block_formats_match_their_bit_layouts(name, element, sem, eps, block, scale):
    info = {f.name: f for f in format_table()}[name]
    assert info.kind == "block-scaled"
    assert (info.sign_bits, info.exponent_bits, info.mantissa_bits) == sem
    assert info.bits == sum(sem)
    assert info.block_size == block
    assert info.eps == eps
    for key in ("max", "min_normal", "min_subnormal"):
        assert getattr(info, key) == element[key] * scale[key], key
    assert info.decimal_digits == pytest.approx(-math.log10(eps))


def _e2m1_round(x: float) -> float:
    grid = sorted(_decode(2, 1, 1))
    # nearest, ties to the even code (the lower index's last bit 0)
    best = min(range(len(grid)), key=lambda i: (abs(grid[i] - abs(x)), i % 2))
    return math.copysign(grid[best], x)


def _mxfp8(block: list[float], i: int) -> float:
    scale = 2.0 ** math.ceil(math.log2(max(map(abs, block)) / E4M3["max"]))  # RCEIL
    return torch.tensor(block[i] / scale).to(torch.float8_e4m3fn).item() * scale


def _nvfp4(block: list[float], i: int) -> float:
    amax = max(map(abs, block))
    tensor_scale = amax / (E2M1["max"] * E4M3["max"])
    block_scale = torch.tensor(amax / E2M1["max"] / tensor_scale).to(
        torch.float8_e4m3fn).item() * tensor_scale
    return _e2m1_round(block[i] / block_scale) * block_scale


def test_block_outlier_demo_matches_a_quantiser_written_here():
    rows = [d for d in run_demos("cpu") if d.name == "block_outlier"]
    assert {(d.dtype, d.verdict) for d in rows} == {
        ("mxfp8", "kept"), ("mxfp8", "underflow"), ("nvfp4", "kept"), ("nvfp4", "underflow")}
    for d in rows:
        big = float(d.expression.rsplit(" ", 1)[1])
        block = [big] + [d.expected_exact] * 31
        expected = (_mxfp8 if d.dtype == "mxfp8" else _nvfp4)(block, 1)
        assert d.result == pytest.approx(expected, rel=1e-6), d
        assert (d.result == 0) == (d.verdict == "underflow")


def test_lab_text_lists_the_block_formats_with_their_blocks():
    from dataclasses import asdict

    from engine.numerics.lab import _formats_text

    lines = _formats_text([asdict(f) for f in format_table()])
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:] if ":" not in line}
    assert rows["mxfp8"][:2] == ["8", "1/4/3"]
    assert float(rows["mxfp8"][2]) == pytest.approx(448 * 2.0**127, rel=1e-2)
    assert rows["nvfp4"][:2] == ["4", "1/2/1"]
    assert float(rows["nvfp4"][2]) == pytest.approx(6 * 448, rel=1e-2)
    assert any(line.startswith("  mxfp8: ") and "32-element block" in line for line in lines)
    assert any(line.startswith("  nvfp4: ") and "16-element block" in line for line in lines)
