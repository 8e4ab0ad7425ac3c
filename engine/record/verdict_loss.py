"""The verdict's loss rule: a recipe's loss against the reference's own progress, judged
with the reference's spread. Pure functions over a run record (engine.record.verdict
applies them).

A recipe is ruled out only when its loss ends above the reference's by more than the
tolerance: the larger of a share of the reference's own drop and the spread (the range of
the reference's final loss over its interleaved rounds where it ran several, else twice
the standard deviation of its step-to-step loss changes, which a steady trend does not
move). Within the tolerance it is a tie; a lower loss is never held against a recipe.
Held-out batches are judged where the report has them, and the training batches always.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from engine.core.events import TrialResult
from engine.record.run_record import RunRecord


@dataclass(frozen=True)
class LossRule:
    """How the final loss is judged on one kind of batches: against what drop and spread."""

    source: str  # "held-out" or "training"
    judged: bool
    drop: float | None  # the reference's own loss drop over the run
    tolerance: float | None  # the largest rise over the reference's final loss allowed
    steps: int
    baseline: str
    text: str  # for the verdict's reasons
    caveat: str | None  # for the headline when the loss cannot be judged

    def losses(self, trial: TrialResult) -> tuple[float, float] | None:
        """(first, final) loss of ``trial`` on this rule's batches, or None."""
        if self.source == "held-out":
            held = trial.heldout_loss
            return None if held is None else (held.loss_before, held.loss_after)
        first = _curve(trial)
        final = trial.summary.final_loss if trial.summary else None
        return None if not first or final is None else (first[0], final)

    def _base(self, record: RunRecord, trial: TrialResult) -> tuple[float, float] | None:
        """The reference's (first, final) loss; on the training batches, final after as many
        steps as ``trial`` ran (a trial from a shorter run is not set against a longer one's
        progress)."""
        base = record.trial(self.baseline)
        losses = self.losses(base)
        steps = [s.loss for s in base.steps]
        n = len(trial.steps)
        if self.source == "training" and losses and 0 < n < len(steps) and \
                steps[n - 1] is not None:
            return losses[0], steps[n - 1]
        return losses

    def diff(self, record: RunRecord, row) -> float | None:
        """A row's final loss minus the reference's, on this rule's batches."""
        trial = record.trial(row.precision)
        mine, base = self.losses(trial), self._base(record, trial)
        return None if mine is None or base is None else mine[1] - base[1]

    def judge(self, record: RunRecord, row) -> tuple[str, str] | None:
        """(judgement, note) when the row's loss rules it out, else None (a tie or better)."""
        if not self.judged:
            return None
        trial = record.trial(row.precision)
        mine = self.losses(trial)
        if mine is None:
            return "no loss", f"no {self.source} loss to compare with {self.baseline}'s"
        base = self._base(record, trial)
        if mine[1] - base[1] <= self.tolerance:  # NaN compares False: ruled out below
            return None
        versus = (f"{self.source} loss {mine[1]:.4g} vs {base[1]:.4g}, beyond the tolerance "
                  f"{self.tolerance:.3g}")
        if math.isfinite(mine[1]) and mine[1] > mine[0]:
            return "diverged", f"diverged: {self.source} loss rose from {mine[0]:.4g}; {versus}"
        return "learned less", f"learned less than {self.baseline}: {versus}"


def _curve(trial: TrialResult) -> list[float]:
    return [s.loss for s in trial.steps if s.loss is not None and math.isfinite(s.loss)]


def loss_spread(trial: TrialResult) -> tuple[float | None, str]:
    """(how far the reference's loss moves by noise alone, how that was measured)."""
    by_round: dict[int, float] = {}
    for s in trial.steps:
        if s.loss is not None and math.isfinite(s.loss):
            by_round[s.round] = s.loss  # each round's last loss
    if len(by_round) > 1:
        finals = list(by_round.values())
        return max(finals) - min(finals), (f"the range of its final loss over its "
                                           f"{len(finals)} rounds")
    changes = [b - a for a, b in zip(_curve(trial), _curve(trial)[1:])]
    if len(changes) < 2:
        return None, "no loss curve to measure a spread on"
    return 2.0 * statistics.stdev(changes), ("twice the standard deviation of its "
                                             "step-to-step loss changes")


def loss_rules(record: RunRecord, baseline: str, share: float, min_drop: float
               ) -> list[LossRule]:
    """The rules for this record: held-out batches where the reference has them, then the
    training batches."""
    base = record.trial(baseline)
    spread, how = loss_spread(base)
    sources = (["held-out"] if base.heldout_loss is not None else []) + ["training"]
    return [_rule(record, baseline, source, share, min_drop, spread, how)
            for source in sources]


def _rule(record, baseline, source, share, min_drop, spread, how) -> LossRule:
    base = record.trial(baseline)
    steps = base.heldout_loss.steps if source == "held-out" else len(base.steps)
    probe = LossRule(source, False, None, None, steps, baseline, "", None)
    losses = probe.losses(base)
    drop = None if losses is None else losses[0] - losses[1]
    where = ("held-out batches no step trained on" if source == "held-out" else
             "the training batches")
    if drop is None or not math.isfinite(drop) or drop < min_drop:
        fell = "n/a" if drop is None else f"only {drop:.3g}"
        caveat = (f"cannot judge the loss after {steps} steps: {baseline}'s {source} loss "
                  f"fell {fell} (under {min_drop}); profile more steps (--steps) to judge it")
        return LossRule(source, False, drop, None, steps, baseline, f"loss: {caveat}", caveat)
    tolerance = max(share * drop, spread or 0.0)
    noise = ("no spread could be measured" if spread is None
             else f"{baseline}'s spread is {spread:.3g} ({how})")
    return LossRule(source, True, drop, tolerance, steps, baseline, (
        f"loss: judged on {where}: {baseline}'s loss fell {drop:.3g} in {steps} steps and "
        f"{noise}; a precision may end at most {tolerance:.3g} (the larger of {share:.0%} of "
        f"that drop and the spread) above {baseline}'s final loss: within that it ties, and "
        "a lower loss is never held against it"), None)
