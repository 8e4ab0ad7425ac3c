"""What the verdict weighs beyond ten steps' speed: lost updates, a changed optimiser (the
loss: engine.record.verdict_loss). Pure functions over a run record's trials
(engine.record.verdict applies them).
"""

from __future__ import annotations

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
