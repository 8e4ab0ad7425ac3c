"""A memory timeline as a chart draws it, one builder for the window and the HTML report.

Stacked from the bottom in ``CATEGORIES`` order (what the step begins with first, then what
it makes), each category in its colour (Paul Tol's "light" scheme, as the report's memory
bars); the phases as spans along the x axis (aten ops of the step); the peak; and beside
the stack the levels it is judged against: the card's usable memory and, on a GPU, the
allocator's reserved peak and NVML's process memory, so the gap the allocator keeps and
the CUDA context show.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

CATEGORY_STYLE = {  # category -> (label, colour)
    "params": ("parameters", "#77AADD"),
    "buffers": ("buffers", "#AAAA00"),
    "quant_state": ("quantisation state", "#BBCC33"),
    "optimizer": ("optimizer state", "#EEDD88"),
    "inputs": ("input batch", "#DDDDDD"),
    "grads": ("gradients", "#EE8866"),
    "weight_copies": ("weight copies", "#99DDFF"),
    "activations": ("activations", "#FFAABB"),
    "temporaries": ("temporaries", "#44BB99"),
    "ddp_buckets": ("DDP gradient buckets", "#BBBBBB"),
}


@dataclass(frozen=True)
class Level:
    """A horizontal mark beside the stack."""

    key: str  # "usable", "reserved", "nvml"
    label: str
    bytes: int


@dataclass(frozen=True)
class TimelineSeries:
    title: str  # the precision (and, where two are drawn, which one)
    x: list[int]  # op index of each point
    categories: list[str]  # drawn ones (never-held categories left out), bottom first
    values: list[list[int]]  # per drawn category, bytes at each point
    phases: list[str]  # each point's phase
    modules: list[str | None]
    spans: list[tuple[int, int, str]]  # (first x, last x, phase) in step order
    peak_x: int
    peak_bytes: int
    ops: int
    levels: list[Level] = field(default_factory=list)
    note: str = ""
    # another step's total on the same axes (plan: the measured trial), its x scaled to this
    # step's op count (the two ran different numbers of ops); empty: none
    overlay_label: str = ""
    overlay_x: list[float] = field(default_factory=list)
    overlay_bytes: list[int] = field(default_factory=list)

    def totals(self) -> list[int]:
        return [sum(col) for col in zip(*self.values, strict=True)] if self.values else []

    def hover(self, index: int, category: str) -> str:
        """What a point says under the pointer: the category, its bytes, phase, module."""
        label = CATEGORY_STYLE.get(category, (category, ""))[0]
        value = self.values[self.categories.index(category)][index]
        where = self.phases[index]
        module = self.modules[index]
        return (f"{self.title}: {label} {size_text(value)} of {size_text(self.totals()[index])}"
                f"\nop {self.x[index]:,} of {self.ops:,}, {where}"
                f"\nmodule: {module or 'none (outside any forward)'}")


def size_text(value: float) -> str:
    for scale, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} B"


def series(timeline, title: str, levels: list[Level] | None = None) -> TimelineSeries:
    """``timeline``: a MemoryTimeline (engine.core.events)."""
    points = timeline.points
    columns = list(zip(*(p.category_bytes for p in points), strict=True))
    drawn = [i for i, col in enumerate(columns) if any(col)]
    x = [p.op_index for p in points]
    phases = [p.phase for p in points]
    spans, i = [], 0
    for phase, group in itertools.groupby(phases):
        n = len(list(group))
        spans.append((x[i], x[min(i + n, len(x) - 1)], phase))
        i += n
    return TimelineSeries(
        title=title, x=x, categories=[timeline.categories[i] for i in drawn],
        values=[list(columns[i]) for i in drawn], phases=phases,
        modules=[p.module for p in points], spans=spans,
        peak_x=x[timeline.peak_index], peak_bytes=timeline.peak_bytes, ops=timeline.ops,
        levels=levels or [])


def gpu_levels(memory) -> list[Level]:
    """The allocator's and NVML's figures of a GPU trial (a MemoryBreakdown); none on the CPU."""
    if memory is None:
        return []
    out = []
    if memory.peak_allocated_bytes is not None:
        out.append(Level("allocated", "allocator allocated (peak, measured steps)",
                         memory.peak_allocated_bytes))
    if memory.peak_reserved_bytes is not None:
        out.append(Level("reserved", "allocator reserved (peak, measured steps)",
                         memory.peak_reserved_bytes))
    if memory.nvml_process_bytes is not None:
        out.append(Level("nvml", "NVML process memory", memory.nvml_process_bytes))
    return out


def card_level(environment: dict | None, memory) -> tuple[Level | None, str]:
    """The card's usable memory for a measured run: what CUDA reports minus the measured
    context gap (NVML - reserved), or the reason there is none."""
    device = (environment or {}).get("device") or {}
    total = device.get("total_memory_bytes") if device.get("kind") == "cuda" else None
    if total is None:
        return None, "card memory n/a: the trial ran on the CPU"
    gap = getattr(memory, "context_gap_bytes", None)
    if gap is None:
        return Level("usable", "card memory (as CUDA reports it)", total), ""
    return Level("usable", "card usable (CUDA's figure - measured context)", total - gap), ""


def trial_series(trial, environment: dict | None) -> TimelineSeries | None:
    """A measured trial's chart, or None where it has no timeline."""
    if trial.memory_timeline is None:
        return None
    card, why = card_level(environment, trial.memory)
    levels = ([card] if card else []) + gpu_levels(trial.memory)
    if getattr(trial, "compiled", None):
        why = "; ".join(filter(None, [why, (
            f"{trial.precision}: its timed steps were compiled; this watched step ran eagerly, "
            "which keeps what compiled kernels fuse away (the compiled steps' own peak is "
            "the allocator's, where the device has one)")]))
    return dataclasses.replace(series(trial.memory_timeline, trial.precision, levels), note=why)


def shared_top(all_series: list[TimelineSeries]) -> int:
    """The top of the one byte axis every chart of a comparison shares."""
    tops = [max([s.peak_bytes, *(lv.bytes for lv in s.levels), *s.overlay_bytes])
            for s in all_series]
    return max(tops, default=0)


def plan_series(trial) -> TimelineSeries | None:
    """A plan trial's traced step (engine.run.plan.PlanTrial) with each card's usable memory,
    and the measured trial's total where one recorded a timeline; None where not traced."""
    if trial.memory_timeline is None:
        return None
    levels = [Level("usable", f"{c.card} usable", c.usable_bytes) for c in trial.cards
              if c.usable_bytes is not None]
    traced = series(trial.memory_timeline, f"{trial.precision} (traced)", levels)
    measured = trial.measured
    if measured is None or measured.memory_timeline is None:
        return traced
    other = series(measured.memory_timeline, "", [])
    ratio = traced.ops / max(other.ops, 1)
    return dataclasses.replace(
        traced, overlay_label=f"measured total (run {measured.run_id})",
        overlay_x=[x * ratio for x in other.x], overlay_bytes=other.totals())
