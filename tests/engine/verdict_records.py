"""Hand-built run records for the verdict's tests (real event dataclasses, seeded noise)."""

from __future__ import annotations

import statistics

import numpy as np

from engine.core.events import StepSample, TrialResult, TrialSummary
from engine.record.run_record import RunRecord
from engine.record.spread import step_spread

GiB = 1024**3
TOKENS = 512
STEPS = 20


def trial(precision, step_ms, peak_bytes, final_loss, *, cv=0.01, skipped=0, status="ok",
           lora=None, seed=0, host_load=None, steps=STEPS):
    if status != "ok":
        return TrialResult(precision, status, f"{precision} failed in the test")
    rng = np.random.default_rng([seed, len(precision)])
    times = step_ms * (1 + cv * rng.standard_normal(steps))
    samples = [
        StepSample(precision=precision, step=i, warmup=i == 0,
                   loss=final_loss + 0.01 * (steps - 1 - i), step_ms=float(ms),
                   tokens_per_s=TOKENS / (ms / 1e3), tflops=None, mfu=None,
                   allocated_bytes=None, reserved_bytes=None, loss_scale=None,
                   skipped=0 < i <= skipped, grad_norm=None, time_s=1e9 + i)
        for i, ms in enumerate(times)
    ]
    timed = [s.step_ms for s in samples if not s.warmup and not s.skipped]
    summary = TrialSummary(
        steps_measured=steps - 1, median_step_ms=statistics.median(timed),
        tokens_per_s=TOKENS / (statistics.median(timed) / 1e3), tflops=None, mfu=None,
        mfu_reason="test", peak_flops=None, peak_flops_source=None,
        peak_memory_bytes=peak_bytes, peak_memory_method="test", skipped_steps=skipped,
        final_loss=final_loss, final_loss_scale=None, spread=step_spread(samples, TOKENS))
    return TrialResult(precision, "ok", steps=samples, summary=summary, lora=lora,
                       param_count=1000, trainable_params=1000, host_load=host_load)


def record(*trials, bf16_hardware=True):
    rec = RunRecord(environment={"device": {"kind": "cpu", "bf16_hardware": bf16_hardware}})
    rec.trials = list(trials)
    return rec


def median_ms(trial):
    return statistics.median(s.step_ms for s in trial.steps if not s.warmup and not s.skipped)
