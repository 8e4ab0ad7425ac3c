"""Where a model's gradients and activations sit against each format's range.

One forward and backward under the recipe gives the real gradient values; their log2
histogram, drawn under the fp16 / bf16 / fp8 ranges, shows what would flush to zero or
overflow, and from it the loss scales that keep fp16 safe on this model and batch.

Histogram bins are fractions of a binade: bin edges sit at multiples of 1/k in log2, so
the count below any power of two (every format's underflow threshold is one) is exact.
"""

from __future__ import annotations

import math
import re

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from engine.core.recipes import Recipe, fp32_precision
from engine.numerics.formats import float_format
from engine.numerics.step import forward_loss
from engine.record.lab_results import (
    ActivationStats,
    FormatRange,
    GradientStats,
    GroupStats,
    Histogram,
)

RANGE_FORMATS = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
# log2 span of the bin grid: below fp32's smallest subnormal (2^-149) to above its max
_LOG2_LO, _LOG2_HI = -150, 129
UNDERFLOW_TARGET = 1e-3  # the loss scale suggestion allows at most 0.1% of values to flush


def flush_threshold(dtype: torch.dtype) -> float:
    """Magnitudes at or below this round to zero: half the smallest subnormal (ties to 0)."""
    fi = torch.finfo(dtype)
    return fi.smallest_normal * fi.eps / 2


def _underflow_mask(magnitudes: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    return (magnitudes > 0) & (magnitudes * scale <= flush_threshold(dtype))


def underflow_fraction(values: torch.Tensor, scale: float, dtype=torch.float16) -> float:
    """Of the nonzero ``values``, the fraction that ``values * scale`` cast to ``dtype`` zeroes."""
    mags = values.detach().float().abs()
    nonzero = int((mags > 0).sum())
    if nonzero == 0:
        return 0.0
    return int(_underflow_mask(mags, scale, dtype).sum()) / nonzero


def format_ranges() -> tuple[FormatRange, ...]:
    out = []
    for name, dtype in RANGE_FORMATS.items():
        info = float_format(name, dtype, "")
        out.append(FormatRange(name, math.log2(info.min_subnormal),
                               math.log2(info.min_normal), math.log2(info.max)))
    return tuple(out)


class _Accumulator:
    """Running counts for one group of tensors, kept on the device until the end."""

    def __init__(self, name: str, bins_per_octave: int, scale: float, device: torch.device):
        self.name = name
        self.k = bins_per_octave
        self.scale = scale
        self.counts = torch.zeros((_LOG2_HI - _LOG2_LO) * self.k, dtype=torch.int64,
                                  device=device)
        self.tensors = 0
        self.values = 0
        self.dtypes: set[str] = set()
        zero = torch.zeros((), dtype=torch.int64, device=device)
        self.nonzero = self.nonfinite = self.under1 = self.under_scaled = self.above = zero
        self.under_formats = {name: zero for name in RANGE_FORMATS}
        self.max_abs = torch.zeros((), dtype=torch.float32, device=device)

    def add(self, t: torch.Tensor, divisor: float = 1.0) -> None:
        """Count the magnitudes of ``t / divisor`` (in fp32), recording ``t``'s own dtype."""
        self.tensors += 1
        self.values += t.numel()
        self.dtypes.add(str(t.dtype))
        mags = t.detach().float().abs().flatten() / divisor
        finite = torch.isfinite(mags)
        self.nonfinite = self.nonfinite + (~finite).sum()
        mags = mags[finite & (mags > 0)]
        self.nonzero = self.nonzero + mags.numel()
        if mags.numel() == 0:
            return
        self.max_abs = torch.maximum(self.max_abs, mags.max())
        index = torch.ceil(torch.log2(mags) * self.k).long() - _LOG2_LO * self.k
        self.counts += torch.bincount(index.clamp_(0, self.counts.numel() - 1),
                                      minlength=self.counts.numel())
        self.under1 = self.under1 + _underflow_mask(mags, 1.0, torch.float16).sum()
        self.under_scaled = self.under_scaled + _underflow_mask(mags, self.scale,
                                                                torch.float16).sum()
        self.above = self.above + (mags > torch.finfo(torch.float16).max).sum()
        for name, dtype in RANGE_FORMATS.items():
            self.under_formats[name] = (self.under_formats[name]
                                        + _underflow_mask(mags, 1.0, dtype).sum())

    def fraction(self, count: torch.Tensor) -> float | None:
        nonzero = int(self.nonzero)
        return int(count) / nonzero if nonzero else None

    def finish(self, lo: int, hi: int) -> GroupStats:
        """Freeze into ``GroupStats`` with the histogram cut to bins ``lo..hi-1``."""
        edges = tuple(_LOG2_LO + (i - 1) / self.k for i in range(lo, hi + 1))
        nonzero = int(self.nonzero)
        return GroupStats(
            name=self.name,
            tensors=self.tensors,
            values=self.values,
            nonzero=nonzero,
            nonfinite=int(self.nonfinite),
            max_abs=float(self.max_abs) if nonzero else None,
            dtypes=tuple(sorted(self.dtypes)),
            histogram=Histogram(edges, tuple(self.counts[lo:hi].tolist())),
            underflow_fp16_scale1=self.fraction(self.under1),
            underflow_fp16_at_scale=self.fraction(self.under_scaled),
            above_fp16_max=self.fraction(self.above),
        )


def _occupied(accs: list[_Accumulator]) -> tuple[int, int]:
    total = sum(a.counts for a in accs)
    filled = torch.nonzero(total).flatten()
    if filled.numel() == 0:
        return 0, 0
    return int(filled[0]), int(filled[-1]) + 1


_GROUP_PATTERNS = (
    ("head", re.compile(r"(^|\.)(lm_head|cls|classifier|predictions)(\.|$)")),
    ("attention", re.compile(r"(attn|attention|self_attn|[qkvo]_proj|query|key|value)")),
    ("mlp", re.compile(r"(mlp|ffn|feed_forward|intermediate|fc\d?|c_fc|gate_proj|up_proj|"
                       r"down_proj|output\.dense)")),
)


def parameter_group(name: str, module: nn.Module) -> str:
    """A coarse role for a parameter: embeddings, norm, attention, mlp, head or other."""
    kind = type(module).__name__.lower()
    if "embedding" in kind:
        return "embeddings"
    if "norm" in kind:
        return "norm"
    for group, pattern in _GROUP_PATTERNS:
        if pattern.search(name):
            return group
    return "other"


def _owned_parameters(model: nn.Module):
    """(name, owning module, parameter), each shared (tied) parameter once."""
    seen: set[int] = set()
    for mod_name, module in model.named_modules():
        for p_name, param in module.named_parameters(recurse=False):
            if id(param) not in seen:
                seen.add(id(param))
                yield f"{mod_name}.{p_name}" if mod_name else p_name, module, param


def suggest_scales(counts: torch.Tensor, bins_per_octave: int, nonzero: int, max_abs: float,
                   dtype=torch.float16, target: float = UNDERFLOW_TARGET):
    """The power-of-two loss scales that keep ``dtype`` safe for these gradients.

    Upper: the largest 2^k with max|g| * 2^k <= max. Lower: the smallest 2^k that flushes
    at most ``target`` of the nonzero values. ``counts`` is the full bin grid.
    """
    fmax = torch.finfo(dtype).max
    upper = 2.0 ** math.floor(math.log2(fmax / max_abs))
    flush_log2 = round(math.log2(flush_threshold(dtype)))
    # Scale 2^k flushes |g| <= 2^(flush_log2 - k): bins 0..(flush_log2 - k - LO) * bpo.
    # ``last`` is the last bin that may be flushed within the target (-1: none may).
    last = int((torch.cumsum(counts, 0) <= target * nonzero).sum()) - 1
    lower = 2.0 ** math.ceil(flush_log2 - _LOG2_LO - last / bins_per_octave)
    return lower, upper


def gradient_stats(model: nn.Module, batch: dict, recipe: Recipe, loss_scale: float,
                   device: torch.device | str, bins_per_octave: int = 4) -> GradientStats:
    """One forward + backward under ``recipe``; statistics of the unscaled gradients.

    Recipes with a GradScaler run the backward at ``loss_scale`` and divide it out, as
    the scaler does; the others run it unscaled. The fp16 figures then ask what
    ``loss_scale`` would do to these gradients.
    """
    device = torch.device(device)
    backward_scale = loss_scale if recipe.use_scaler else 1.0
    model.zero_grad(set_to_none=True)
    with fp32_precision(recipe):
        loss = forward_loss(model, batch, recipe, device)
        (loss * backward_scale).backward()
    overall = _Accumulator("all", bins_per_octave, loss_scale, device)
    groups: dict[str, _Accumulator] = {}
    for name, module, param in _owned_parameters(model):
        if param.grad is None:
            continue
        group = parameter_group(name, module)
        acc = groups.setdefault(group, _Accumulator(group, bins_per_octave, loss_scale, device))
        acc.add(param.grad, backward_scale)
        overall.add(param.grad, backward_scale)
    model.zero_grad(set_to_none=True)
    if overall.tensors == 0:
        raise ValueError("no parameter received a gradient: is anything trainable?")
    lo, hi = _occupied([overall])
    total = overall.finish(lo, hi)
    if total.max_abs is None:
        lower = upper = ratio = headroom = None
        note = "every gradient is zero: no scale to suggest"
    else:
        lower, upper = suggest_scales(overall.counts, bins_per_octave, total.nonzero,
                                      total.max_abs)
        fmax = torch.finfo(torch.float16).max
        ratio = total.max_abs * loss_scale / fmax
        headroom = -math.log2(ratio)
        if lower > upper:
            note = (f"no single fp16 scale fits: keeping {UNDERFLOW_TARGET:.1%} underflow needs "
                    f"2^{math.log2(lower):.0f}, but 2^{math.log2(upper):.0f} already reaches "
                    "fp16 max; bf16 needs no scale")
        else:
            note = (f"scales 2^{math.log2(lower):.0f}..2^{math.log2(upper):.0f} flush at most "
                    f"{UNDERFLOW_TARGET:.1%} of nonzero gradients and do not overflow fp16 "
                    "on this batch")
    return GradientStats(
        loss=float(loss.detach().float()),
        loss_scale=float(loss_scale),
        backward_scale=float(backward_scale),
        bins_per_octave=bins_per_octave,
        overall=total,
        groups=tuple(acc.finish(lo, hi) for acc in groups.values()),
        underflow_scale1={n: overall.fraction(c) for n, c in overall.under_formats.items()},
        overflow_ratio_fp16=ratio,
        headroom_log2=headroom,
        suggested_scale_min=lower,
        suggested_scale_max=upper,
        suggestion_note=note,
        underflow_target=UNDERFLOW_TARGET,
        format_ranges=format_ranges(),
    )


def activation_stats(model: nn.Module, batch: dict, recipe: Recipe, device: torch.device | str,
                     bins_per_octave: int = 4) -> ActivationStats:
    """The outputs of every submodule in one forward under ``recipe``, by module type."""
    device = torch.device(device)
    accs: dict[str, _Accumulator] = {}

    def record(module, _inputs, output):
        kind = type(module).__name__
        for t in tree_leaves(output):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                acc = accs.setdefault(kind, _Accumulator(kind, bins_per_octave, 1.0, device))
                acc.add(t)

    handles = [m.register_forward_hook(record) for m in model.modules() if m is not model]
    try:
        with torch.no_grad(), fp32_precision(recipe):
            forward_loss(model, batch, recipe, device)
    finally:
        for h in handles:
            h.remove()
    lo, hi = _occupied(list(accs.values()))
    return ActivationStats(
        bins_per_octave=bins_per_octave,
        modules=tuple(acc.finish(lo, hi) for acc in accs.values()),
        format_ranges=format_ranges(),
    )
