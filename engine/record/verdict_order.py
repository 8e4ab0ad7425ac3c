"""Which trial the verdict sets the others against, and how it orders the candidates that
qualify: measured differences first, then a stated tie rule, never noise.

Pure functions over comparison rows (engine.record.verdict applies them).
"""

from __future__ import annotations

from collections.abc import Callable

from engine.core.config import recipe_name
from engine.record.compare import ComparisonRow, format_bytes
from engine.record.run_record import RunRecord

# highest precision first: the reference in a run without an fp32 trial (int8 and nf4 train
# LoRA adapters over a frozen base: last, whatever their bits)
BY_PRECISION = ("fp32", "tf32", "fp16-amp", "bf16-amp", "fp16", "bf16", "fp8-rowwise-gw-hp",
                "fp8-rowwise", "fp8", "fp8-fsdp-ag", "mxfp8", "nvfp4", "int8", "nf4")
# recipes that need fp16's loss scaling (a GradScaler, or a raised Adam epsilon in pure fp16)
FP16_SCALED = ("fp16-amp", "fp16")
TIE_RULE = ("ties (as fast, memory within {share:.0%}, loss within the spread) go to bf16 over "
            "fp16 where bf16 runs natively (no loss scaling to tune), then to the one using "
            "less memory, then to the one listed first")


def _rank(label: str) -> int:
    name = recipe_name(label.rpartition("/")[2])  # "run-id/fp32" in a comparison across runs
    return BY_PRECISION.index(name) if name in BY_PRECISION else len(BY_PRECISION)


def reference(record: RunRecord, baseline: str) -> str:
    """``baseline`` when it finished ok, else the highest-precision trial that did (the
    first to run among equals); the record must have one."""
    ok = [t.precision for t in record.trials if t.status == "ok"]
    return baseline if baseline in ok else min(ok, key=_rank)


Decider = Callable[[ComparisonRow, ComparisonRow], tuple[int, str] | None]


def deciders(groups: dict, base_peak: int | None, share: float, lab: str | None,
             bf16_native: bool) -> list[Decider]:
    """The criteria in order. Each gives (sign, why the loser lost, in a phrase) or None
    when it does not tell ``a`` and ``b`` apart; sign < 0 when ``a`` is the better."""

    def speed(a, b):
        ga, gb = groups[a.precision], groups[b.precision]
        if ga is None or gb is None or ga == gb:
            return None
        return ga - gb, "is slower"

    def memory(a, b, least: float = share * (base_peak or 0), why: str = ""):
        pa, pb = a.peak_memory_bytes, b.peak_memory_bytes
        if pa is None or pb is None or pa == pb or abs(pa - pb) < least:
            return None
        return (-1 if pa < pb else 1), f"uses {format_bytes(abs(pa - pb))} more{why}"

    def numerics_lab(a, b):
        if lab not in (a.precision, b.precision):
            return None
        return (-1 if a.precision == lab else 1), f"the numerics lab recommends {lab}"

    def skipped(a, b):
        sa, sb = a.skipped_steps or 0, b.skipped_steps or 0
        return None if sa == sb else (sa - sb, f"skipped {max(sa, sb)} steps")

    def bf16_over_fp16(a, b):
        fa, fb = (recipe_name(r.precision) in FP16_SCALED for r in (a, b))
        if not bf16_native or fa == fb:
            return None
        return (1 if fa else -1), ("its loss is within the spread: ties go to bf16 over fp16 "
                                   "where bf16 runs natively (no loss scaling to tune)")

    def less_memory(a, b):
        return memory(a, b, 0.0, ": ties go to less memory")

    def listed_first(a, b):
        return 0, "tied on every criterion: the one listed first is named"

    return [speed, memory, numerics_lab, skipped, bf16_over_fp16, less_memory, listed_first]


def decide(a: ComparisonRow, b: ComparisonRow, rules: list[Decider]) -> tuple[int, str]:
    """The first criterion that tells ``a`` and ``b`` apart (the last always does)."""
    return next(said for rule in rules if (said := rule(a, b)) is not None)
