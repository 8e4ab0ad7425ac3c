"""Step-time spread and bootstrap confidence intervals: how sure a speed figure is.

Conventions, stated wherever the figures appear:

- Percentiles (p10, median, p90) use numpy's default linear interpolation
  (Hyndman and Fan type 7).
- CV, the coefficient of variation, is the sample standard deviation (ddof=1) over
  the mean of the measured step times.
- Confidence intervals are percentile bootstrap intervals at ``CI_LEVEL`` over the
  measured (non-warm-up) steps: ``RESAMPLES`` resamples drawn with replacement by
  numpy's default generator (PCG64) seeded with ``SEED``; the statistic is the median
  step time. A ratio of two trials resamples each trial's steps independently.
  (scipy.stats.bootstrap computes the same interval; numpy alone keeps scipy out of
  the bundle.)

Below ``MIN_STEPS`` measured steps no interval is given: a median of fewer values
has too few distinct bootstrap values to bound.
"""

from __future__ import annotations

import numpy as np

from engine.events import StepSample, StepTimeSpread

CI_LEVEL = 0.95
RESAMPLES = 2000
SEED = 0
MIN_STEPS = 5

METHOD = (f"percentile bootstrap of the median step time over the measured steps, "
          f"{CI_LEVEL:.0%} level, {RESAMPLES} resamples, numpy PCG64 seed {SEED}; "
          "p10/p90 by linear interpolation; CV = sample std (ddof=1) / mean")


def _interval(values: np.ndarray) -> tuple[float, float]:
    tail = (1.0 - CI_LEVEL) / 2.0
    low, high = np.quantile(values, [tail, 1.0 - tail])
    return float(low), float(high)


def _bootstrap_medians(step_ms: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    picks = rng.integers(0, len(step_ms), size=(RESAMPLES, len(step_ms)))
    return np.median(step_ms[picks], axis=1)


def median_ci(step_ms) -> tuple[float, float] | None:
    """Bootstrap interval of the median step time; None below ``MIN_STEPS`` steps."""
    x = np.asarray(step_ms, dtype=float)
    if len(x) < MIN_STEPS:
        return None
    return _interval(_bootstrap_medians(x, np.random.default_rng(SEED)))


def ratio_ci(numerator_ms, denominator_ms) -> tuple[float, float] | None:
    """Bootstrap interval of median(numerator) / median(denominator).

    With step times, fp32's over another precision's is that precision's speed-up.
    None when either side has fewer than ``MIN_STEPS`` steps.
    """
    a = np.asarray(numerator_ms, dtype=float)
    b = np.asarray(denominator_ms, dtype=float)
    if len(a) < MIN_STEPS or len(b) < MIN_STEPS:
        return None
    rng = np.random.default_rng(SEED)
    return _interval(_bootstrap_medians(a, rng) / _bootstrap_medians(b, rng))


def measured_step_ms(steps: list[StepSample]) -> list[float]:
    return [s.step_ms for s in steps if not s.warmup]


def step_spread(steps: list[StepSample], tokens_per_step: int) -> StepTimeSpread | None:
    """The spread of a trial's measured steps (all rounds), or None without any."""
    x = np.asarray(measured_step_ms(steps), dtype=float)
    if len(x) == 0:
        return None
    p10, p90 = np.percentile(x, [10, 90])
    mean = float(np.mean(x))
    cv = float(np.std(x, ddof=1) / mean) if len(x) > 1 and mean > 0 else None
    ci = median_ci(x)
    tokens_ci = None
    if ci is not None and ci[0] > 0:
        # tokens/s falls as step time rises: the interval's ends swap
        tokens_ci = (tokens_per_step / (ci[1] / 1e3), tokens_per_step / (ci[0] / 1e3))
    rounds = len({s.round for s in steps if not s.warmup})
    return StepTimeSpread(
        steps=len(x), p10_step_ms=float(p10), p90_step_ms=float(p90), mean_step_ms=mean,
        cv=cv, median_step_ms_ci=ci, tokens_per_s_ci=tokens_ci, ci_level=CI_LEVEL,
        method=METHOD, rounds=rounds,
    )
