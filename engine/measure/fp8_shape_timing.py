"""Each distinct (M, K, N) Linear shape of a model timed in bf16 and in float8, per device.

The payoff model (engine.measure.fp8_payoff) predicts; this measures. A shape is one
bias-free Linear with bf16 weights and a bf16 input, its forward and backward (the three
GEMMs a training step runs) timed as one call; the float8 version is the same layer
converted by torchao's ``convert_to_float8_training`` with the recipe's own
``Float8LinearConfig`` (engine.core.recipes.float8_config), so its casts and amax passes
are inside the time. Eager, as a one-layer module: torch.compile would fuse the casts into
their producers, so eager figures are a float8 layer's worst case.

A GPU is timed with CUDA events, a CPU with the host clock; each shape gets ``WARMUP``
calls, then ``REPS`` timed ones, keeping the median and the fastest and slowest. The whole
stays within ``BUDGET_S``: shapes too large for it (on a CPU, whose float8 runs emulated,
over ``CPU_MAX_FLOPS``) are skipped, and said so. Results are cached beside the matmul
peak (``$AMPSCOPE_CACHE_DIR``), keyed like it by the device's name and torch's version; a
device's entry gathers the shapes of every model measured on it. A card's payoff row uses
an entry only where the entry's device is that card in the peaks table: a CPU's timings,
or another card's, are never a card's figures.
"""

from __future__ import annotations

import copy
import os
import statistics
import time

import torch
from torch import nn

from engine.measure import matmul_peak
from engine.measure.fp8_payoff import RECIPES
from engine.measure.fp8_shape_cache import read_cache, shape_key, write_cache

LABELS = tuple(r.label for r in RECIPES if r.peak_dtype == "fp8")  # torchao's float8 recipes
WARMUP = 2
REPS = {"cuda": 10, "cpu": 5}
BUDGET_S = {"cuda": 30.0, "cpu": 30.0}
# a CPU's float8 GEMM is emulated (~1 GFLOP/s): larger shapes would take minutes
CPU_MAX_FLOPS = 5e8
CONVENTION = ("measured: one bias-free Linear's forward + backward (its three GEMMs, the "
              "float8 casts included), eager, bf16 weights and input; speed-up = bf16 median "
              "/ float8 median")


def distinct_shapes(layers) -> list[tuple[int, int, int]]:
    """Each (M, K, N) of ``layers`` (engine.measure.fp8_payoff.Layer) once, smallest first."""
    return sorted({(la.m, la.k, la.n) for la in layers}, key=lambda s: (s[0] * s[1] * s[2], s))


def untimed_recipes(info) -> dict[str, str]:
    """Recipe label -> why it cannot be timed on ``info``'s device."""
    if info.kind == "cuda":
        cap = tuple(info.compute_capability or (0, 0))
        if cap < (8, 9):
            why = (f"{info.name} (compute capability {cap[0]}.{cap[1]}) has no float8 GEMM: "
                   "torchao's float8 needs 8.9+")
            return dict.fromkeys(LABELS, why)
        return {}
    from engine.measure.cpu_float8 import unsupported_on_cpu

    return {label: why for label, why in unsupported_on_cpu().items() if label in LABELS}


def _call(layer: nn.Module, x: torch.Tensor, grad: torch.Tensor):
    def step():
        for p in layer.parameters():
            p.grad = None  # as zero_grad(set_to_none=True): no accumulation inside the time
        layer(x).backward(grad)
    return step


def _times_ms(step, device: torch.device, reps: int) -> list[float]:
    for _ in range(WARMUP):
        step()
    out = []
    if device.type == "cuda":
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        for _ in range(reps):
            begin.record()
            step()
            end.record()
            end.synchronize()
            out.append(begin.elapsed_time(end))
        return out
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _summary(times: list[float]) -> dict:
    return {"median_ms": statistics.median(times), "min_ms": min(times),
            "max_ms": max(times), "reps": len(times)}


def time_shape(m: int, k: int, n: int, labels, device: torch.device, reps: int) -> dict:
    """One shape's bf16 and float8 timings: {"bf16": summary, label: summary...}."""
    from torchao.float8 import convert_to_float8_training

    from engine.core.recipes import float8_config, recipe

    gen = torch.Generator(device="cpu").manual_seed(0)  # the user's RNG is left alone
    base = nn.Sequential(nn.utils.skip_init(nn.Linear, k, n, bias=False))  # no init draw
    with torch.no_grad():
        base[0].weight.copy_(torch.randn(n, k, generator=gen) / k**0.5)
    base = base.to(device=device, dtype=torch.bfloat16)
    x = torch.randn(m, k, generator=gen).to(device=device, dtype=torch.bfloat16)
    x.requires_grad_(True)
    grad = torch.randn(m, n, generator=gen).to(device=device, dtype=torch.bfloat16)
    out = {"bf16": _summary(_times_ms(_call(base, x, grad), device, reps))}
    for label in labels:
        layer = convert_to_float8_training(copy.deepcopy(base),
                                           config=float8_config(recipe(label)))
        out[label] = _summary(_times_ms(_call(layer, x, grad), device, reps))
    return out


def measure(info, layers, rerun: bool = False, on_shape=None) -> dict:
    """Time each distinct shape of ``layers`` not yet cached for ``info``'s device (all of
    them with ``rerun``), merge them into its cache entry, and return that entry."""
    key = matmul_peak.cache_key(info.name, info.kind)
    entries = read_cache()
    entry = entries.get(key) if not rerun else None
    if not isinstance(entry, dict) or not isinstance(entry.get("shapes"), dict):
        entry = {"device": info.name, "kind": info.kind, "torch_version": torch.__version__,
                 "shapes": {}}
    reasons = untimed_recipes(info)
    labels = [label for label in LABELS if label not in reasons]
    device, reps = info.torch_device, REPS[info.kind]
    skipped, timed, start = {}, 0, time.perf_counter()
    with info.device_context():
        for m, k, n in distinct_shapes(layers):
            name = shape_key(m, k, n)
            if name in entry["shapes"] or not labels:
                continue
            if info.kind == "cpu" and 6 * m * k * n > CPU_MAX_FLOPS:
                skipped[name] = (f"not timed: {6 * m * k * n / 1e9:.3g} GFLOP a call is more "
                                 "than a CPU's emulated float8 times in the budget")
            elif time.perf_counter() - start > BUDGET_S[info.kind]:
                skipped[name] = f"not timed: the {BUDGET_S[info.kind]:.0f} s budget was spent"
            else:
                if on_shape is not None:
                    on_shape(name)
                entry["shapes"][name] = {"m": m, "k": k, "n": n,
                                         **time_shape(m, k, n, labels, device, reps)}
                timed += 1
        if info.kind == "cuda":
            torch.cuda.empty_cache()
    if not timed and "measured_at_s" in entry:  # all cached: the entry stays as it was
        return {**entry, "key": key, "skipped": skipped}
    entry.update(measured_at_s=time.time(), reasons=reasons, timer="CUDA events" if
                 info.kind == "cuda" else "perf_counter", convention=CONVENTION,
                 load_avg_1m=os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
                 cpu_count=os.cpu_count())
    entries[key] = entry
    write_cache(entries)
    return {**entry, "key": key, "skipped": skipped}
