"""What the verdict weighs beyond ten steps' speed: the loss drop, lost updates, a changed
optimiser. Pure functions over a run record's trials (engine.record.verdict applies them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.core.config import recipe_name, split_label
from engine.core.events import TrialResult
from engine.measure.lost_updates_text import STOCHASTIC, lost_share
from engine.record.run_record import RunRecord

# what to train in instead of pure low-precision weights
REMEDY = {"bf16": "bf16-amp, or bf16+adamw-bf16-sr (stochastic rounding)",
          "fp16": "fp16-amp or bf16-amp (fp32 master weights)"}
# the recipes whose trained weights are stored in 16 bits with no fp32 master copy, and about
# where an update rounds away (half the spacing, relative to the weight); no torch here, so
# the window's first paint does not load it
ROUNDS_AWAY = {"bf16": "2^-8", "fp16": "2^-11"}
FP16_TINY = 2.0**-14  # fp16's smallest normal: Adam's epsilon in pure fp16 (engine.run.trial)


@dataclass(frozen=True)
class LossRule:
    """How the final loss is judged in this record: on which batches, against what drop."""

    source: str  # "held-out" or "training"
    judged: bool
    drop: float | None  # fp32's own loss drop over the run
    tolerance: float | None  # the largest difference from fp32's final loss allowed
    steps: int
    baseline: str
    text: str  # for the verdict's reasons
    caveat: str | None  # for the headline when the loss cannot be judged

    def diff(self, record: RunRecord, row) -> float | None:
        """A row's final loss minus fp32's, on this rule's batches."""
        if self.source == "training":
            return row.final_loss_diff_vs_fp32
        mine = record.trial(row.precision).heldout_loss
        base = record.trial(self.baseline).heldout_loss
        return None if mine is None or base is None else mine.loss_after - base.loss_after


def loss_rule(record: RunRecord, baseline: str, share: float, min_drop: float) -> LossRule:
    base = record.trial(baseline)
    held = base.heldout_loss
    if held is not None:
        source, steps, drop = "held-out", held.steps, held.loss_before - held.loss_after
    else:
        losses = [s.loss for s in base.steps if s.loss is not None and math.isfinite(s.loss)]
        final = base.summary.final_loss if base.summary else None
        source, steps = "training", len(base.steps)
        drop = losses[0] - final if losses and final is not None else None
    where = ("held-out batches no step trained on" if source == "held-out" else
             "the training batches (this report has no held-out loss)")
    if drop is None or not math.isfinite(drop) or drop < min_drop:
        fell = "n/a" if drop is None else f"only {drop:.3g}"
        caveat = (f"cannot judge the loss after {steps} steps: fp32's {source} loss fell "
                  f"{fell} (under {min_drop}); profile more steps (--steps) to judge it")
        return LossRule(source, False, drop, None, steps, baseline,
                        f"loss: {caveat}", caveat)
    tolerance = share * drop
    return LossRule(source, True, drop, tolerance, steps, baseline, (
        f"loss: judged on {where}: fp32's loss fell {drop:.3g} in {steps} steps; a precision "
        f"may end at most {tolerance:.3g} ({share:.0%} of that drop) from fp32's final loss"),
        None)


def _pure(trial: TrialResult) -> str | None:
    """"bf16" or "fp16" for a recipe that trains 16-bit weights with no master copy."""
    name = recipe_name(trial.precision)
    return name if name in ROUNDS_AWAY else None


def lost_updates_reason(trial: TrialResult, most: float) -> tuple[str, str, str] | None:
    """(judgement, note, the headline's phrase) when the trial's lost updates rule it out."""
    name = _pure(trial)
    remedy = REMEDY[name or "bf16"]
    lu = trial.lost_updates
    if lu is not None:
        share = lost_share(lu)
        if share is None or share <= most:
            return None
        how = ("what stochastic rounding's kept update misses" if lu.rounding == "stochastic"
               else "of the update's norm, rounded away")
        lose = f"would lose {share:.0%} of its updates at lr {lu.min_lr:g}"
        return ("loses updates", f"{lose} ({how}; more than {most:.0%}): train in {remedy}",
                f"{trial.precision} {lose}: train in {remedy}")
    if name is None or (split_label(trial.precision)[1] or "") in STOCHASTIC:
        return None
    away = (f"pure {name} weights, no fp32 master copy: an update under about "
            f"{ROUNDS_AWAY[name]} of a weight rounds away")
    return "not measured", (
        f"{away}, and this report did not measure the lost-update share: profile it again "
        f"with this AmpScope to measure it, or train in {remedy}"), (
        f"{trial.precision} ({away}; the share lost was not measured: profile again to "
        f"measure it, or train in {remedy})")


def excluded_text(excluded: dict[str, str]) -> str:
    """The headline's sentence on the precisions ruled out by their lost updates."""
    return "Not recommended: " + "; ".join(excluded.values()) if excluded else ""


def changed_optimizer(trial: TrialResult, optimizer: str = "adamw") -> str | None:
    """The optimiser change a recipe forced (pure fp16 raises Adam's epsilon), or None."""
    if _pure(trial) != "fp16" or (split_label(trial.precision)[1] or optimizer) == "sgd":
        return None
    return (f"a changed optimizer: Adam's epsilon raised from 1e-8 to {FP16_TINY:.2g} (1e-8 "
            "rounds to 0 in float16)")


def changed_optimizers(record: RunRecord) -> list[str]:
    optimizer = (record.config or {}).get("optimizer") or "adamw"
    return [f"{t.precision} ran {text}" for t in record.trials if t.status == "ok"
            and (text := changed_optimizer(t, optimizer)) is not None]
