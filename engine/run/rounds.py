"""Interleaved precisions: mirrored rounds (ABBA), so drift hits every precision alike.

A machine that warms up, throttles or gets busier during a run makes whichever
precision ran last look slower. Benchmark harnesses cancel such drift by alternating
the candidates; here each precision's measured steps are split over ``rounds`` rounds
and the schedule runs round 1 of every precision, then round 2 of every precision in
the reverse order, and so on (fp32, bf16-amp, bf16-amp, fp32). Plain ABAB does not
cancel a steady drift: with two rounds A runs at times 1 and 3, B at 2 and 4, so B
averages one slot later; mirrored, both average the same time, whatever the length of
a round, and with any even number of rounds. Every round is a fresh trial (its own process
by default) with its own warm-up; it receives the steps of the precision's earlier
rounds, numbers its steps after them, and summarises them all, so the last round's
result is the precision's combined result. Only that one is reported as finished. The
untimed work runs once per precision: the SQNR forward and the profiled step in the first
round, the memory step, the held-out loss and the lost updates in the last (whose figures
the combined result keeps; ``RunConfig.last_round``).

``interleave="auto"`` interleaves where each trial is cheap (``CHEAP_RULE``): a
model of at most ``CHEAP_PARAMS`` parameters, whose reload per round costs seconds,
not compiled, and at least ``MIN_ROUND_STEPS`` measured steps in every round.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from engine.core.config import RunConfig
from engine.core.events import StepSample, TrialResult

CHEAP_PARAMS = 400_000_000
MIN_ROUND_STEPS = 5
CHEAP_RULE = (f"a trial is cheap when the model has at most {CHEAP_PARAMS // 10**6} M "
              f"parameters (reloading it for every round costs seconds), is not compiled "
              f"(torch.compile would recompile in every round) and every round measures at "
              f"least {MIN_ROUND_STEPS} steps")


@dataclass(frozen=True)
class TrialRound:
    """One entry of the schedule: round ``round`` (0-based) of ``rounds`` of a precision."""

    precision: str
    round: int
    rounds: int
    config: RunConfig  # the run's config with this round's share of the measured steps


def split_steps(steps: int, rounds: int) -> list[int]:
    """Measured steps per round, as even as whole steps allow, earlier rounds first."""
    return [steps // rounds + (1 if r < steps % rounds else 0) for r in range(rounds)]


def model_params(config: RunConfig) -> int | None:
    """The model's parameter count, from a build on the meta device; None if it fails."""
    try:
        import torch

        from engine.models.load import load_config, model_class, resolve_source

        model_config, task = load_config(resolve_source(config.model), config.trust_remote_code)
        with torch.device("meta"):
            model = model_class(task).from_config(model_config)
        return sum(p.numel() for p in model.parameters())
    except Exception:  # any failure only means "not known to be cheap"
        return None


def choose_rounds(config: RunConfig, params: int | None = None, info=None) -> tuple[int, str]:
    """How many rounds, and why, in one sentence for the run's log. ``info`` is the probed
    device (its gating verdicts say whether fp8 would be compiled there)."""
    n = len(config.precisions)
    if config.interleave == "off":
        return 1, "precisions run one after another (interleaving is off)"
    if n < 2:
        return 1, "one precision: nothing to interleave"
    if config.interleave == "on":
        return config.rounds, (f"precisions interleaved in {config.rounds} rounds "
                               "(interleaving is on)")
    if config.steps < config.rounds * MIN_ROUND_STEPS:
        return 1, (f"precisions run one after another: {config.steps} measured steps are too "
                   f"few for {config.rounds} rounds of at least {MIN_ROUND_STEPS} "
                   f"({CHEAP_RULE})")
    if config.compile:
        return 1, (f"precisions run one after another: torch.compile would recompile the model "
                   f"in every round ({CHEAP_RULE}); --interleave on forces rounds")
    from engine.core.recipes import compiles, recipe  # loads torch: not at the window's start-up

    def compiled(label: str) -> bool:
        verdict = info.verdict(label) if info is not None else None
        return compiles(recipe(label), config.compile, config.warmup, verdict)

    if any(compiled(p.partition("@")[0]) for p in config.precisions):
        return 1, ("precisions run one after another: fp8 trials are compiled, and "
                   f"torch.compile would recompile the model in every round ({CHEAP_RULE}); "
                   "--interleave on forces rounds")
    if params is None:
        params = model_params(config)
    if params is None or params > CHEAP_PARAMS:
        size = "unknown" if params is None else f"{params / 1e6:,.0f} M"
        return 1, (f"precisions run one after another: the model's parameter count is {size} "
                   f"({CHEAP_RULE}); --interleave on forces rounds")
    return config.rounds, (f"precisions interleaved in {config.rounds} rounds ("
                           f"{'/'.join(map(str, split_steps(config.steps, config.rounds)))} "
                           f"measured steps) to cancel drift: {params / 1e6:,.1f} M parameters "
                           f"and {config.steps} steps make each trial cheap ({CHEAP_RULE})")


def schedule(config: RunConfig, rounds: int) -> list[TrialRound]:
    """Every precision's round r before any precision's round r+1; odd rounds run the
    precisions in reverse (ABBA), so a linear drift adds the same time to each."""
    shares = split_steps(config.steps, rounds)
    return [
        TrialRound(p, r, rounds, config if rounds == 1 else config.replace(steps=shares[r]))
        for r in range(rounds)
        for p in (config.precisions if r % 2 == 0 else config.precisions[::-1])
    ]


@dataclass
class RoundBook:
    """What the runner needs between rounds: each precision's latest result and whether it
    is done (its last round ran, or a round ended other than ok)."""

    latest: dict[str, TrialResult] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)

    def prior_steps(self, precision: str) -> tuple[StepSample, ...]:
        latest = self.latest.get(precision)
        return tuple(latest.steps) if latest is not None else ()

    def prior_flops(self, precision: str):
        """The FLOPs an earlier round counted (the same model and shapes: a later round
        does not count them again), or None."""
        latest = self.latest.get(precision)
        flops = latest.flops if latest is not None else None
        return flops if flops is not None and flops.counted_per_step is not None else None

    def finish(self, item: TrialRound, result: TrialResult) -> TrialResult | None:
        """Record a round's result; the precision's final result once it is done."""
        self.latest[item.precision] = result
        if result.status == "ok" and item.round < item.rounds - 1:
            return None
        self.done.add(item.precision)
        return result

    def stopped(self, item: TrialRound) -> TrialResult:
        """The result of a precision whose next round the user stopped before it started."""
        self.done.add(item.precision)
        reason = "the run was stopped before this trial started"
        latest = self.latest.get(item.precision)
        if latest is None:
            return TrialResult(item.precision, "cancelled", reason)
        reason = (f"the run was stopped before round {item.round + 1} of {item.rounds}; the "
                  "steps of the earlier rounds are kept")
        return dataclasses.replace(latest, status="cancelled", reason=reason)
