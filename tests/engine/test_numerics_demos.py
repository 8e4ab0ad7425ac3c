import dataclasses
import json

import numpy as np
import pytest
import torch

from engine.numerics.demos import (
    accumulation,
    autocast_dtypes,
    one_plus_small,
    round_stochastic_bf16,
    rounding_modes,
    run_demos,
    tiny_value,
)

CPU = torch.device("cpu")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
DELTAS = {"1 + 2**-12": 2.0**-12, "1 + 0.0001": 1e-4, "1 + 0.001": 1e-3}


def test_one_plus_small_matches_torch_arithmetic():
    results = one_plus_small(CPU)
    assert len(results) == 9
    for r in results:
        delta = DELTAS[r.expression]
        dtype = DTYPES[r.dtype]
        expected = (torch.tensor(1.0, dtype=dtype) + torch.tensor(delta, dtype=dtype)).item()
        assert r.result == expected
        assert r.verdict == ("kept" if expected != 1.0 else "swallowed")
    by = {(r.expression, r.dtype): r.verdict for r in results}
    assert by[("1 + 0.0001", "fp16")] == "swallowed"
    assert by[("1 + 0.0001", "fp32")] == "kept"


def _numpy_fp16_running_sum(value: float, n: int) -> float:
    acc = np.float16(0)
    for _ in range(n):
        acc = np.float16(acc + np.float16(value))
    return float(acc)


def test_sequential_fp16_sum_matches_numpy_and_torch_sum_is_reported_as_is():
    results = {(r.expression, r.dtype): r for r in accumulation(CPU, n=4096)}
    seq16 = results[("sum of 4096 x 16, one addition at a time", "fp16")]
    assert seq16.result == _numpy_fp16_running_sum(16.0, 4096)
    assert seq16.expected_exact == 65536
    reduced16 = results[("torch.sum of 4096 x 16", "fp16")]
    assert reduced16.result == torch.full((4096,), 16.0, dtype=torch.float16).sum().item()
    assert reduced16.verdict == "inf"
    assert results[("sum of 4096 x 16, one addition at a time", "fp32")].result == 65536
    small = results[("sum of 4096 x 0.01, one addition at a time", "fp16")]
    assert small.result == _numpy_fp16_running_sum(0.01, 4096)
    assert small.verdict == "stalled"


def test_tiny_value_flushes_in_fp16_only():
    for r in tiny_value(CPU):
        assert r.result == torch.tensor(1e-8, dtype=DTYPES[r.dtype]).item()
    verdicts = {r.dtype: r.verdict for r in tiny_value(CPU)}
    assert verdicts == {"fp16": "zero", "bf16": "nonzero", "fp32": "nonzero"}


def test_autocast_dtypes_match_direct_calls():
    a = torch.randn(4, 4)
    results = {(r.expression, r.dtype): r.result for r in autocast_dtypes(CPU)}
    assert results[("torch.mm(a, a) outside autocast", "fp32")] == "torch.float32"
    for name in ("fp16", "bf16"):
        with torch.autocast("cpu", dtype=DTYPES[name]):
            mm = torch.mm(a, a).dtype
            ln = torch.nn.functional.layer_norm(a, (4,)).dtype
        assert results[(f"torch.mm(a, a) inside autocast(cpu, {name})", name)] == str(mm)
        assert results[(f"layer_norm(fp32 a) inside autocast(cpu, {name})", name)] == str(ln)


def test_stochastic_rounding_is_unbiased_between_neighbours():
    x = torch.full((200_000,), 1 + 0.25 * 2.0**-7)  # a quarter of the way from 1 to the next
    rounded = round_stochastic_bf16(x, torch.Generator().manual_seed(0)).float()
    assert set(rounded.unique().tolist()) == {1.0, 1 + 2.0**-7}
    assert rounded.mean().item() == pytest.approx(x[0].item(), abs=2e-5)


def test_round_to_nearest_loses_small_updates_and_stochastic_keeps_them():
    r = {d.expression.split("(")[1].rstrip(")"): d
         for d in rounding_modes(CPU, steps=2000, weights=64)}
    exact = r["bf16 round-to-nearest"].expected_exact
    assert exact == pytest.approx(1.2, abs=0.01)
    assert r["bf16 round-to-nearest"].result == 1.0
    assert abs(r["bf16 stochastic rounding"].result - exact) < 0.03
    assert r["fp32 master weight"].result == pytest.approx(exact, abs=1e-4)


def test_run_demos_serialises_to_json():
    results = run_demos(CPU)
    assert {r.name for r in results} == {
        "one_plus_small", "accumulate", "tiny_value", "autocast", "rounding", "block_outlier"
    }
    assert all(r.device == "cpu" for r in results)
    json.dumps([dataclasses.asdict(r) for r in results])
