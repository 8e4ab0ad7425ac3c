"""Step-time spread and bootstrap confidence intervals: how sure a speed figure is.

Conventions, stated wherever the figures appear:

- Percentiles (p10, median, p90) use numpy's default linear interpolation
  (Hyndman and Fan type 7).
- CV, the coefficient of variation, is the sample standard deviation (ddof=1) over
  the mean of the measured step times.
- Confidence intervals are percentile bootstrap intervals at ``CI_LEVEL`` over the
  measured (non-warm-up) steps: ``RESAMPLES`` resamples drawn with replacement by
  numpy's default generator (PCG64) seeded with ``[SEED, CRC-32 of the step times as
  float64 bytes]``; the statistic is the median step time. A ratio of two trials divides
  their resampled medians, so each trial's steps are resampled independently (and once:
  a trial's resampled medians are cached, the ratios of many pairs cost no resampling).
  (scipy.stats.bootstrap computes the same interval; numpy alone keeps scipy out of
  the bundle.)

Below ``MIN_STEPS`` measured steps no interval is given: a median of fewer values
has too few distinct bootstrap values to bound.

Drift between a trial's interleaved rounds (the machine warming, throttling or getting
busier) is not in the bootstrap, which treats the steps as one steady sample: a ratio's
interval is widened by each side's drift (``widened``), so recipes far apart stay told
apart and close ones tie.
"""

from __future__ import annotations

import statistics
import zlib
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy loads on first use: the window's start-up does not need it
    import numpy as np

from engine.core.events import StepSample, StepTimeSpread

CI_LEVEL = 0.95
RESAMPLES = 2000
SEED = 0
MIN_STEPS = 5

METHOD = (f"percentile bootstrap of the median step time over the measured steps, "
          f"{CI_LEVEL:.0%} level, {RESAMPLES} resamples, numpy PCG64 seeded with "
          f"[{SEED}, CRC-32 of the step times]; p10/p90 by linear interpolation; "
          "CV = sample std (ddof=1) / mean")


def _interval(values: np.ndarray) -> tuple[float, float]:
    import numpy as np

    tail = (1.0 - CI_LEVEL) / 2.0
    low, high = np.quantile(values, [tail, 1.0 - tail])
    return float(low), float(high)


@lru_cache(maxsize=256)
def _cached_medians(data: bytes) -> np.ndarray:
    import numpy as np

    x = np.frombuffer(data, dtype=np.float64)
    rng = np.random.default_rng([SEED, zlib.crc32(data)])
    picks = rng.integers(0, len(x), size=(RESAMPLES, len(x)))
    medians = np.median(x[picks], axis=1)
    medians.flags.writeable = False
    return medians


def bootstrap_medians(step_ms) -> np.ndarray:
    """``RESAMPLES`` medians of resamples of ``step_ms`` (read-only, cached by value)."""
    import numpy as np

    return _cached_medians(np.ascontiguousarray(step_ms, dtype=np.float64).tobytes())


def median_ci(step_ms) -> tuple[float, float] | None:
    """Bootstrap interval of the median step time; None below ``MIN_STEPS`` steps."""
    if len(step_ms) < MIN_STEPS:
        return None
    return _interval(bootstrap_medians(step_ms))


def ratio_ci(numerator_ms, denominator_ms) -> tuple[float, float] | None:
    """Bootstrap interval of median(numerator) / median(denominator).

    With step times, fp32's over another precision's is that precision's speed-up.
    None when either side has fewer than ``MIN_STEPS`` steps.
    """
    if len(numerator_ms) < MIN_STEPS or len(denominator_ms) < MIN_STEPS:
        return None
    return _interval(bootstrap_medians(numerator_ms) / bootstrap_medians(denominator_ms))


def round_drift(steps: list[StepSample]) -> float | None:
    """Largest over smallest median of a trial's interleaved rounds, minus 1 (None: one
    round)."""
    by_round: dict[int, list[float]] = {}
    for s in steps:
        if not s.warmup:
            by_round.setdefault(s.round, []).append(s.step_ms)
    if len(by_round) < 2:
        return None
    medians = [statistics.median(v) for v in by_round.values()]
    return max(medians) / min(medians) - 1.0 if min(medians) > 0 else None


def widened(ci: tuple[float, float] | None, *drifts: float | None
            ) -> tuple[float, float] | None:
    """A ratio's interval with each side's round drift added: either side's rounds may sit
    ``1 + drift`` away from the other's, so both ends move out by the product."""
    if ci is None:
        return None
    factor = 1.0
    for drift in drifts:
        factor *= 1.0 + max(drift or 0.0, 0.0)
    return ci[0] / factor, ci[1] * factor


def measured_step_ms(steps: list[StepSample]) -> list[float]:
    """Times of the measured steps the GradScaler did not skip (a skipped step skips the
    optimiser: faster, so not the same work), as the trial's median uses them."""
    return [s.step_ms for s in steps if not s.warmup and not s.skipped]


def step_spread(steps: list[StepSample], tokens_per_step: int) -> StepTimeSpread | None:
    """The spread of a trial's measured steps (all rounds), or None without any."""
    import numpy as np

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
