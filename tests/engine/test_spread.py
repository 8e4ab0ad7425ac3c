"""Step-time spread and the noisy verdict, checked against numpy computations written here."""

import math
import zlib

import numpy as np
import pytest

from engine.core.events import StepSample, TrialResult, TrialSummary
from engine.record import spread
from engine.record.compare import CV_LIMIT, comparison_rows, speed_verdict
from engine.record.run_record import RunRecord

TOKENS = 2048


def _steps(precision, step_times, warmup=(), rounds=None):
    return [StepSample(precision, i, i in warmup, 3.0, ms, TOKENS / (ms / 1e3), None, None, None,
                       None, None, False, 1.0, float(i),
                       round=0 if rounds is None else rounds[i])
            for i, ms in enumerate(step_times)]


def _trial(precision, step_times, warmup=(), rounds=None):
    steps = _steps(precision, step_times, warmup, rounds)
    measured = [s.step_ms for s in steps if not s.warmup]
    median = float(np.median(measured))
    summary = TrialSummary(len(measured), median, TOKENS / (median / 1e3), None, None, "cpu",
                           None, None, None, "n/a", 0, 3.0, None,
                           spread=spread.step_spread(steps, TOKENS))
    return TrialResult(precision, "ok", steps=steps, summary=summary)


def _numpy_bootstrap_medians(x):
    """The percentile bootstrap as written in Efron and Tibshirani, one resample at a time,
    from the generator the module documents: PCG64 seeded with [SEED, CRC-32 of the data]."""
    x = np.asarray(x, dtype=np.float64)
    rng = np.random.default_rng([spread.SEED, zlib.crc32(x.tobytes())])
    out = np.empty(spread.RESAMPLES)
    for b in range(spread.RESAMPLES):
        out[b] = np.median(x[rng.integers(0, len(x), size=len(x))])
    return out


def test_spread_matches_numpy():
    rng = np.random.default_rng(42)
    x = rng.gamma(20.0, 5.0, size=60)  # skewed, like step times
    warm = [500.0, 400.0]  # warm-up steps: left out of every figure
    s = spread.step_spread(_steps("fp32", [*warm, *x], warmup=(0, 1)), TOKENS)
    assert s.steps == 60
    assert s.p10_step_ms == pytest.approx(np.percentile(x, 10))
    assert s.p90_step_ms == pytest.approx(np.percentile(x, 90))
    assert s.mean_step_ms == pytest.approx(x.mean())
    assert s.cv == pytest.approx(x.std(ddof=1) / x.mean())
    assert s.ci_level == 0.95 and "bootstrap" in s.method and s.rounds == 1
    # the interval, recomputed by a plain loop over resamples with the same seeded generator
    medians = _numpy_bootstrap_medians(x)
    low, high = np.percentile(medians, [2.5, 97.5])
    assert s.median_step_ms_ci == pytest.approx((low, high))
    assert s.tokens_per_s_ci == pytest.approx((TOKENS / (high / 1e3), TOKENS / (low / 1e3)))
    assert low < np.median(x) < high


def test_median_ci_width_matches_normal_theory():
    # for normal data the median's standard error is sqrt(pi/2) sigma / sqrt(n); one
    # sample's bootstrap width scatters around it, so average over samples
    rng = np.random.default_rng(7)
    n, sigma = 400, 5.0
    widths = [np.subtract(*spread.median_ci(rng.normal(100.0, sigma, size=n))[::-1])
              for _ in range(30)]
    expected = 2 * 1.959964 * math.sqrt(math.pi / 2) * sigma / math.sqrt(n)
    assert np.mean(widths) == pytest.approx(expected, rel=0.1)


def test_ratio_ci_matches_numpy():
    rng = np.random.default_rng(3)
    a, b = rng.normal(300, 6, size=25), rng.normal(150, 3, size=30)
    ratios = _numpy_bootstrap_medians(a) / _numpy_bootstrap_medians(b)
    assert spread.ratio_ci(a, b) == pytest.approx(tuple(np.percentile(ratios, [2.5, 97.5])))


def test_no_interval_below_the_minimum_steps():
    few = [10.0, 11.0, 12.0, 10.5][: spread.MIN_STEPS - 1]
    s = spread.step_spread(_steps("fp32", few), TOKENS)
    assert s.median_step_ms_ci is None and s.tokens_per_s_ci is None
    assert s.cv == pytest.approx(np.std(few, ddof=1) / np.mean(few))
    assert spread.step_spread(_steps("fp32", [10.0]), TOKENS).cv is None
    assert spread.ratio_ci(few, [1.0] * 10) is None


# --- the noisy verdict ---------------------------------------------------------------


def _clean(ms, n=20):
    return [ms * (1 + 0.005 * ((i * 7) % 5 - 2)) for i in range(n)]


def _record(*trials):
    return RunRecord(run_id="t", config={}, trials=list(trials), status="ok")


def test_clean_samples_are_ranked_and_rows_say_significant():
    record = _record(_trial("fp32", _clean(300.0)), _trial("bf16-amp", _clean(100.0)),
                     _trial("fp16-amp", _clean(99.8)))
    verdict = speed_verdict(record.trials)
    # 100 vs 99.8 ms, each within +-1%: tied; both 3x faster than fp32, far outside any CI
    assert verdict.status == "ranked"
    assert verdict.ranking == (("fp16-amp", "bf16-amp"), ("fp32",))
    assert "fp16-amp = bf16-amp > fp32" in verdict.text
    rows = {r.precision: r for r in comparison_rows(record, verdict)}
    assert rows["fp32"].speed_verdict == "baseline" and rows["fp32"].speedup_ci is None
    assert rows["bf16-amp"].speed_verdict == "faster"
    low, high = rows["bf16-amp"].speedup_ci
    assert low < rows["bf16-amp"].speedup_vs_fp32 < high
    assert rows["bf16-amp"].step_ms_cv < CV_LIMIT


def test_wide_spread_widens_the_ci_and_never_ranks():
    # the median says bf16-amp is faster, but its steps swing from 0.3x to 1.7x: the CI of
    # the ratio is as wide, includes 1, and the two tie (issue #44: a CV above 10% no
    # longer silences every ranking, it widens the CIs)
    swinging = [100.0 * (0.3, 1.7, 0.6, 1.4)[i % 4] for i in range(20)]
    record = _record(_trial("fp32", _clean(120.0)), _trial("bf16-amp", swinging))
    verdict = speed_verdict(record.trials)
    assert verdict.status == "tied" and verdict.ranking is None
    cv = np.std(swinging, ddof=1) / np.mean(swinging)
    assert f"bf16-amp step time varies {cv:.0%} (CV above 10%): wide CIs" in verdict.text
    assert "idle machine" in verdict.suggestion
    # far apart, the same swing still ranks: fp32 is 10x slower than every swinging step
    record = _record(_trial("fp32", _clean(1200.0)), _trial("bf16-amp", swinging))
    assert speed_verdict(record.trials).ranking == (("bf16-amp",), ("fp32",))


def test_too_few_steps_is_noisy_and_suggests_more():
    record = _record(_trial("fp32", _clean(120.0, n=3)), _trial("bf16-amp", _clean(60.0)))
    verdict = speed_verdict(record.trials)
    assert verdict.noisy and "too few measured steps for a spread (need 5): fp32 3" in verdict.text
    assert "--steps 40" in verdict.suggestion


def _drifting(ms, drift, n=10):
    """Two interleaved rounds of ``n`` steady steps, the second ``drift`` slower."""
    return _clean(ms, n) + _clean(ms * (1 + drift), n), [0] * n + [1] * n


def test_round_drift_widens_the_ratios_ci_instead_of_silencing_the_ranking():
    # each round steady, but the second round of fp32 ran 30% slower: the machine drifted
    times, rounds = _drifting(100.0, 0.30)
    record = _record(_trial("fp32", times, rounds=rounds), _trial("bf16-amp", _clean(60.0)))
    verdict = speed_verdict(record.trials)
    assert verdict.ranking == (("bf16-amp",), ("fp32",))
    assert "fp32's rounds differ by 30% in median step time: the CIs of their ratios are " \
        "widened by that drift" in verdict.text
    # the row's CI: the bootstrap's, both ends moved out by 1 + fp32's drift
    ci = spread.ratio_ci(times, _clean(60.0))
    row = {r.precision: r for r in comparison_rows(record, verdict)}["bf16-amp"]
    assert row.speedup_ci == pytest.approx((ci[0] / 1.3, ci[1] * 1.3))
    assert row.speedup_ci[0] > 1.0 and row.speed_verdict == "faster"


def test_far_apart_recipes_stay_ranked_through_drift_and_close_ones_tie():
    # the CPU sweeps: fp32 15x faster than emulated-half recipes, every recipe's two
    # rounds 24% apart (the widened CI of 15x spans about 15 / 1.24^2 .. 15 * 1.24^2)
    fp32, r32 = _drifting(10.0, 0.24)
    half, rh = _drifting(150.0, 0.24)
    record = _record(_trial("fp32", fp32, rounds=r32), _trial("fp16", half, rounds=rh))
    verdict = speed_verdict(record.trials)
    assert verdict.status == "ranked" and verdict.ranking == (("fp32",), ("fp16",))
    row = {r.precision: r for r in comparison_rows(record, verdict)}["fp16"]
    assert row.speedup_ci[1] < 1.0 and row.speed_verdict == "slower"
    # two recipes 5% apart, each drifting 20%: the widened CI includes 1.0, a tie
    a, ra = _drifting(100.0, 0.20)
    b, rb = _drifting(105.0, 0.20)
    record = _record(_trial("fp32", a, rounds=ra), _trial("bf16-amp", b, rounds=rb))
    verdict = speed_verdict(record.trials)
    assert verdict.status == "tied" and verdict.ranking is None
    low, high = {r.precision: r for r in comparison_rows(record, verdict)}["bf16-amp"].speedup_ci
    assert low < np.median(a) / np.median(b) < high and low <= 1.0 <= high


def test_overlapping_speeds_are_tied_not_ranked():
    record = _record(_trial("fp32", _clean(100.0)), _trial("bf16-amp", _clean(100.3)))
    verdict = speed_verdict(record.trials)
    assert verdict.status == "tied" and verdict.ranking is None
    rows = {r.precision: r for r in comparison_rows(record, verdict)}
    assert rows["bf16-amp"].speed_verdict == "not significant"
    low, high = rows["bf16-amp"].speedup_ci
    assert low <= 1.0 <= high
