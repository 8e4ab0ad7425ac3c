"""Would a low-precision recipe pay, layer by layer? A calibrated GEMM-and-cast model.

A float8 (or block-scaled) Linear runs three GEMMs per step, forward (M x K x N),
grad-input (M x N x K) and grad-weight (K x M x N), M being the tokens of a micro-batch,
and casts its input, weight and output gradient before them. It pays when the GEMMs'
saving beats the casts' memory traffic. torchao's roofline (benchmarks/float8/
float8_roofline.py) times each GEMM as max(2MKN / (peak x 0.78), bytes / (bandwidth x
0.92), 2 us) and is optimistic (it reads 1.25 at 8192 x 4096 x 4096 rowwise on an H100,
where torchao measured 1.00), so two things here are fitted to measurements:

- the low-precision GEMM's gain over bf16 grows with its size: 1 + (G - 1) / (1 + (F_h /
  FLOPs) ^ p), G being the card's peak ratio times ``GAIN_EFFICIENCY``;
- each cast costs bytes per element of input, weight and output gradient at the card's
  memory bandwidth (the weight is the fp32 master copy, read twice).

Fitted (least absolute error, hinges for the "at most" claims) to torchao's H100 rowwise
table for LayerNorm-Linear-Sigmoid compiled (M, K, N in 1024..16384), its two tensorwise
points and the H200's GPT-2 small run (compiled fp8 31.4 ms against compiled bf16-amp
23.4 ms at 8 x 1024, tests/data/h200_plan/h200_trials.json). Against the rowwise table the
figures are within ``SPREAD``; the largest gaps are at the largest shapes (at most 1.52 at
M = 16384 where torchao measured up to 1.72; 1.38 at 8192 against 1.46) and at K = 1024
(0.96 against at most 0.94). The tensorwise points read 0.75 and 1.36 (published 0.80 and
1.39): tensorwise's cast cost was raised from the value those two alone give (0.21 of
rowwise's) until no GPT-2 layer pays on the H200, as the run showed. That run still lost
more than the model says (step x0.99 predicted, 0.74 measured): the rest of its loss is
outside the GEMMs and their casts. MXFP8 and NVFP4 have no published per-shape table: they
take rowwise's fit with their own peak ratio and cast bytes, and say they are
uncalibrated.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from engine.measure.peaks import memory_bandwidth, peak_flops

BF16_EFFICIENCY = 0.78  # torchao's roofline: a bf16 GEMM at 78% of the datasheet peak
BANDWIDTH_EFFICIENCY = 0.92  # and a memory-bound one at 92% of the datasheet bandwidth
MIN_GEMM_S = 2e-6  # torchao's floor for any one GEMM (a launch)
GAIN_EFFICIENCY = 0.985  # the largest low-precision GEMMs reach 98.5% of the peak ratio
HALF_GAIN_FLOPS = 1.04e12  # at this GEMM size (on an H100's bf16 peak) half of the gain
GAIN_RAMP = 0.61
H100_BF16 = 989.4e12  # the card the ramp was fitted on: a faster card needs larger GEMMs
# rowwise cast traffic, bytes per element at the datasheet bandwidth (fitted)
CAST_BYTES = {"input": 14.1, "weight": 18.3, "grad": 6.6}
SPREAD = 0.21  # largest gap between the model and a published point it was fitted on
PAYS_ABOVE = 1.0  # a layer pays when its three GEMMs with casts run faster than in bf16


@dataclass(frozen=True)
class LowRecipe:
    label: str  # the AmpScope precision that runs it
    peak_dtype: str  # peaks table column of its GEMMs
    cast_scale: float  # its casts' traffic against rowwise's
    calibration: str


RECIPES = (
    LowRecipe("fp8", "fp8", 0.27, "fitted: torchao's tensorwise points (1024x2048x1024 "
              "0.80, 4096x8192x16384 1.39, H100) and the H200's GPT-2 small run; tensorwise "
              "scales are one amax per tensor, fused by torch.compile into the producer"),
    LowRecipe("fp8-rowwise", "fp8", 1.0, "fitted: torchao's H100 rowwise table "
              "(LayerNorm-Linear-Sigmoid, compiled, M/K/N 1024..16384)"),
    LowRecipe("mxfp8", "mxfp8", 0.6, "uncalibrated: rowwise's fit with MXFP8's peak and "
              "cast bytes (one pass per layout, 1/32 scale bytes, no separate amax: 6 "
              "against rowwise's 10 bytes an element); no published per-shape table"),
    LowRecipe("nvfp4", "nvfp4", 0.71, "uncalibrated: rowwise's fit with NVFP4's peak and "
              "cast bytes (half-byte values, 1/16 scale bytes, one tensor amax: 7.1 against "
              "rowwise's 10 an element); no published per-shape table"),
)
# torchao's MX/NVFP4 training kernels need compute capability 10 (engine.measure.gating):
# the datacenter Blackwell GPUs; elsewhere they run emulated, which never pays
NATIVE_BLOCK_SCALED = re.compile(r"\bG?B[23]00\b")
CONVENTION = ("predicted speed-up of a Linear layer's three training GEMMs (forward, "
              "grad-input, grad-weight) with their operands' casts against the same GEMMs "
              "in bf16, M = tokens per micro-batch; step speed-up: the 16-bit step with each "
              "converted layer's GEMM time divided by its speed-up")


@dataclass(frozen=True)
class Layer:
    name: str
    m: int
    k: int  # in_features
    n: int  # out_features


@dataclass(frozen=True)
class LayerPayoff:
    name: str
    m: int
    k: int
    n: int
    speedup: float
    pays: bool
    bf16_us: float  # the three GEMMs in bf16
    low_us: float  # the three GEMMs in low precision, casts included
    cast_us: float
    why: str


def _gemms(m: int, k: int, n: int):
    """(rows, inner, cols) of forward, grad-input and grad-weight."""
    return ((m, k, n), (m, n, k), (k, m, n))


def _bf16_s(rows: int, inner: int, cols: int, bf16: float, bw: float) -> float:
    flops = 2 * rows * inner * cols
    moved = 2 * (rows * inner + inner * cols + rows * cols)
    return max(flops / (bf16 * BF16_EFFICIENCY), moved / (bw * BANDWIDTH_EFFICIENCY),
               MIN_GEMM_S)


def layer_payoff(layer: Layer, recipe: LowRecipe, bf16: float, low: float,
                 bw: float) -> LayerPayoff:
    """One layer's three GEMMs in bf16 and in ``recipe`` on a card with these peaks
    (FLOP/s) and memory bandwidth (bytes/s)."""
    m, k, n = layer.m, layer.k, layer.n
    gain_max = low / bf16 * GAIN_EFFICIENCY
    half = HALF_GAIN_FLOPS * bf16 / H100_BF16
    bf16_s = low_s = 0.0
    for rows, inner, cols in _gemms(m, k, n):
        base = _bf16_s(rows, inner, cols, bf16, bw)
        flops = 2 * rows * inner * cols
        gain = 1 + (gain_max - 1) / (1 + (half / flops) ** GAIN_RAMP)
        moved = rows * inner + inner * cols + 2 * rows * cols  # 1-byte operands, bf16 out
        bf16_s += base
        low_s += max(base / gain, moved / (bw * BANDWIDTH_EFFICIENCY), MIN_GEMM_S)
    cast_s = recipe.cast_scale * (m * k * CAST_BYTES["input"] + k * n * CAST_BYTES["weight"]
                                  + m * n * CAST_BYTES["grad"]) / bw
    speedup = bf16_s / (low_s + cast_s)
    saving = bf16_s - low_s
    pays = speedup > PAYS_ABOVE
    why = (f"GEMMs save {saving * 1e6:.3g} us, casts cost {cast_s * 1e6:.3g} us"
           + ("" if pays else ": below break-even"))
    return LayerPayoff(layer.name, m, k, n, round(speedup, 3), pays, bf16_s * 1e6,
                       (low_s + cast_s) * 1e6, cast_s * 1e6, why)


def card_recipes(card: str) -> tuple[list[LowRecipe], str | None]:
    """The low-precision recipes ``card`` runs natively, or why none."""
    bf16 = peak_flops(card, "bf16")
    if bf16.flops_per_s is None:
        return [], (f"'{card}' has no dense bf16 rate in resources/peak_flops.json to "
                    "weigh a low-precision GEMM against")
    if memory_bandwidth(card).bytes_per_s is None:
        return [], memory_bandwidth(card).source
    runs = [r for r in RECIPES if peak_flops(card, r.peak_dtype).flops_per_s is not None
            and (r.peak_dtype == "fp8" or NATIVE_BLOCK_SCALED.search(card))]
    return runs, None if runs else f"{card} has no fp8 or block-scaled GEMM rate in the table"


def payoff(layers: list[Layer], cards, step_ms: dict | None = None) -> dict:
    """``payoff[key][recipe]``: ``step_speedup`` and ``layers`` (name, m, k, n, speedup,
    pays, ...), ``cards`` being (key, the card's name as the peaks table matches it).
    ``step_ms[key]`` is (the 16-bit step in ms, where it comes from), or absent: the
    step's speed-up is then n/a. A card with no recipe maps to ``{"reason": ...}``."""
    out = {}
    for key, card in cards:
        recipes, reason = card_recipes(card)
        if reason:
            out[key] = {"reason": reason}
            continue
        bf16 = peak_flops(card, "bf16").flops_per_s
        bw = memory_bandwidth(card).bytes_per_s
        out[key] = {r.label: _recipe_payoff(layers, r, bf16, peak_flops(card, r.peak_dtype)
                                            .flops_per_s, bw, (step_ms or {}).get(key))
                    for r in recipes}
    return out


def _recipe_payoff(layers, recipe, bf16, low, bw, step) -> dict:
    rows = [layer_payoff(layer, recipe, bf16, low, bw) for layer in layers]
    gemm_ms = sum(r.bf16_us for r in rows) / 1e3
    entry = {"step_speedup": None, "layers": [asdict(r) for r in rows],
             "keep_bf16": [r.name for r in rows if not r.pays],
             "calibration": recipe.calibration, "spread": SPREAD, "convention": CONVENTION}
    if step is None or step[0] is None:
        entry["step_basis"] = ("n/a: no 16-bit step to weigh the GEMMs against (plan "
                               "bf16-amp beside it)")
        return entry
    step_ms, source = step
    basis = max(step_ms, gemm_ms)
    entry["step_basis"] = (f"{source}: {step_ms:.4g} ms" + (
        "" if basis == step_ms else
        f", less than its Linear GEMMs at 78% of the peak ({gemm_ms:.4g} ms), so that"))
    saved_ms = sum(r.bf16_us - r.low_us for r in rows) / 1e3
    entry["step_speedup"] = round(basis / (basis - saved_ms), 4)
    # converting only the layers that pay (the filter to paste)
    saved_ms = sum(r.bf16_us - r.low_us for r in rows if r.pays) / 1e3
    entry["step_speedup_paying_only"] = round(basis / (basis - saved_ms), 4)
    return entry


def break_even_tokens(k: int, n: int, label: str, card: str, tokens: int,
                      limit: int = 1 << 22) -> int | None:
    """The fewest tokens per micro-batch (``tokens`` doubled) at which a K x N layer pays
    under recipe ``label`` on ``card``; None: not below ``limit`` (or no such recipe)."""
    recipe = next((r for r in RECIPES if r.label == label), None)
    bf16, low = peak_flops(card, "bf16").flops_per_s, None
    if recipe is not None:
        low = peak_flops(card, recipe.peak_dtype).flops_per_s
    bw = memory_bandwidth(card).bytes_per_s
    if None in (bf16, low, bw):
        return None
    m = tokens
    while m <= limit:
        if layer_payoff(Layer("", m, k, n), recipe, bf16, low, bw).pays:
            return m
        m *= 2
    return None
