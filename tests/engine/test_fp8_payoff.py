"""engine.measure.fp8_payoff against what was published and measured: torchao's H100
rowwise table (LayerNorm-Linear-Sigmoid, compiled), its tensorwise examples, its roofline's
bf16 GEMM time, and the H200's GPT-2 small run (tests/data/h200_plan/h200_trials.json)."""

import json
from pathlib import Path

import pytest
from transformers import GPT2Config

from engine.measure.fp8_payoff import (
    RECIPES,
    SPREAD,
    Layer,
    layer_payoff,
    payoff,
)
from engine.run.fp8_layers import linear_layers, module_filter

ROOT = Path(__file__).resolve().parents[2]
H100 = (989.4e12, 1978.9e12, 3.35e12)  # H100 SXM5 dense bf16, fp8 (datasheet), bandwidth
SIZES = (1024, 2048, 4096, 8192, 16384)
TENSORWISE, ROWWISE = (next(r for r in RECIPES if r.label == name)
                       for name in ("fp8", "fp8-rowwise"))


def speedup(m, k, n, recipe=ROWWISE):
    return layer_payoff(Layer("x", m, k, n), recipe, *H100).speedup


def test_bf16_time_is_torchaos_roofline():
    """Three GEMMs, each max(2MKN / (peak x 0.78), bytes / (bandwidth x 0.92), 2 us)."""
    for m, k, n in [(1024, 1024, 1024), (8192, 768, 3072), (16384, 8192, 4096)]:
        expected = 0.0
        for a, b, c in ((m, k, n), (m, n, k), (k, m, n)):
            expected += max(2 * a * b * c / (989.4e12 * 0.78),
                            2 * (a * b + b * c + a * c) / (3.35e12 * 0.92), 2e-6)
        got = layer_payoff(Layer("x", m, k, n), ROWWISE, *H100).bf16_us
        assert got == pytest.approx(expected * 1e6, rel=1e-9)


@pytest.mark.parametrize("m", [1024, 2048])
def test_rowwise_never_pays_at_small_m(m):
    # torchao measured 0.38-0.65 at M = 1024 and at most 0.99 at M = 2048
    top = 0.65 if m == 1024 else 0.99
    for k in SIZES:
        for n in SIZES:
            s = speedup(m, k, n)
            assert s < 1.0 and s <= top + SPREAD
            if m == 1024:
                assert s >= 0.38 - SPREAD


def test_rowwise_never_pays_at_k_1024_nor_small_n():
    for m in SIZES:
        for other in SIZES:
            # K = 1024: at most 0.94 measured
            assert speedup(m, 1024, other) <= 0.94 + SPREAD and speedup(m, 1024, other) < 1.0
            if m <= 8192:  # N <= 2048: at most 0.93 measured
                assert speedup(m, other, 2048) <= 0.93 + SPREAD
                assert speedup(m, other, 2048) < 1.0
            assert speedup(m, other, 1024) < 1.0


def test_rowwise_break_even_and_largest_gains():
    assert speedup(8192, 4096, 4096) == pytest.approx(1.00, abs=SPREAD)
    assert speedup(4096, 4096, 8192) == pytest.approx(1.01, abs=SPREAD)
    for m, published in ((4096, 1.18), (8192, 1.46), (16384, 1.72)):
        best = max(speedup(m, k, n) for k in SIZES for n in SIZES)
        assert best == pytest.approx(published, abs=SPREAD)
        assert best > 1.0  # large shapes pay


def test_tensorwise_examples():
    assert speedup(1024, 2048, 1024, TENSORWISE) == pytest.approx(0.80, abs=0.05)  # fitted: 0.75
    assert speedup(4096, 8192, 16384, TENSORWISE) == pytest.approx(1.39, abs=0.05)  # fitted: 1.36


def test_gpt2_small_on_the_h200_gains_nothing_as_measured():
    trials = json.loads((ROOT / "tests" / "data" / "h200_plan" / "h200_trials.json")
                        .read_text(encoding="utf-8"))["trials"]

    def step(precision, compiled):
        return next(t["median_step_ms"] for t in trials if t["precision"] == precision
                    and t["compile"] == compiled and (t["batch_size"], t["seq_len"]) ==
                    (8, 1024))

    bf16_ms, fp8_ms = step("bf16-amp", True), step("fp8", False)  # fp8 always compiles
    assert fp8_ms > bf16_ms  # the H200 measured a loss
    layers = linear_layers("gpt2", 8 * 1024)
    c = GPT2Config()
    per_block = sorted([(c.n_embd, 3 * c.n_embd), (c.n_embd, c.n_embd),
                        (c.n_embd, 4 * c.n_embd), (4 * c.n_embd, c.n_embd)])
    assert sorted((la.k, la.n) for la in layers) == sorted(per_block * c.n_layer)
    entry = payoff(layers, [("H200", "H200 SXM")], {"H200": (bf16_ms, "measured")})["H200"]
    fp8 = entry["fp8"]
    saved_ms = sum(r["bf16_us"] - r["low_us"] for r in fp8["layers"]) / 1e3
    assert fp8["step_speedup"] == pytest.approx(bf16_ms / (bf16_ms - saved_ms), rel=1e-3)
    assert fp8["step_speedup"] < 1.0  # no gain predicted, as measured
    assert entry["fp8-rowwise"]["step_speedup"] < fp8["step_speedup"]  # heavier casts


def test_block_scaled_recipes_only_where_torchao_runs_them_natively():
    layers = [Layer("up", 8192, 4096, 14336)]
    cards = [("B200", "NVIDIA B200"), ("H100", "H100 SXM"), ("5090", "NVIDIA GeForce RTX 5090"),
             ("A100", "A100-SXM4-80GB")]
    got = payoff(layers, cards)
    assert set(got["B200"]) == {"fp8", "fp8-rowwise", "mxfp8", "nvfp4"}
    assert set(got["H100"]) == {"fp8", "fp8-rowwise"}
    assert set(got["5090"]) == {"fp8", "fp8-rowwise"}  # sm_120: torchao emulates MX
    assert "fp8" in got["A100"]["reason"]  # no fp8 rate: the reason, no recipe
    assert got["B200"]["mxfp8"]["calibration"].startswith("uncalibrated")
    assert got["B200"]["fp8"]["step_basis"].startswith("n/a")


@pytest.mark.parametrize(("recipe", "skipped"), [
    (ROWWISE, lambda k, n: n <= 2048 or k <= 1024 or (n <= 4096 and k <= 2048)),
    (TENSORWISE, lambda k, n: k <= 4096 and n <= 1024),
])
def test_what_torchaos_filter_skips_does_not_pay(recipe, skipped):
    """torchao's H100 filter (float8_linear_utils): the shapes it leaves in bf16 gain
    nothing here up to M = 8192 tokens, and at most 1% at 16384."""
    shapes = [(k, n) for k in SIZES for n in SIZES if skipped(k, n)]
    assert shapes
    for m in SIZES:
        for k, n in shapes:
            assert speedup(m, k, n, recipe) < (1.0 if m <= 8192 else 1.01)


def test_the_filter_to_paste_keeps_exactly_the_named_layers():
    rows = [{"name": la.name} for la in linear_layers("gpt2", 1024)]
    keep = [r["name"] for r in rows if r["name"].endswith(".c_attn")] + [
        "transformer.h.0.mlp.c_fc"]
    convert = eval(module_filter(keep, rows))  # noqa: S307 (as a user pastes it)
    assert sorted(r["name"] for r in rows if not convert(None, r["name"])) == sorted(keep)
    assert not convert(None, "lm_head")  # kept, as AmpScope's fp8 recipes keep it
