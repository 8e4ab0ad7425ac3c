"""A median never includes a trial's first step: it compiles, autotunes and allocates for the
first time. "--warmup 0" still runs one warm-up step, and the trial says so."""

import dataclasses
import statistics
import subprocess
import sys
from pathlib import Path

from engine.core.config import MIN_WARMUP, WARMUP_RAISED_NOTE, RunConfig
from engine.core.events import StepSample
from engine.measure.device import probe
from engine.record.journal import read_run
from engine.record.summary import summarise
from engine.run.trial import run_trial

ROOT = Path(__file__).resolve().parents[2]
FP8_EAGER = ROOT / "tests" / "data" / "h200-2026-11-27" / "trimmed" / "01-gpt2-fp8.json"


def _trial(warmup):
    config = RunConfig(model="tiny", batch_size=2, seq_len=32, steps=2, warmup=warmup,
                       device="cpu", isolation="inline", profile_step=False)
    events = []
    result = run_trial(config, "fp32", probe("cpu"), events.append, lambda: False)
    assert result.status == "ok", result.reason
    return result, [e for e in events if isinstance(e, StepSample)]


def test_warmup_zero_still_warms_up_one_step_and_says_so():
    result, steps = _trial(warmup=0)
    assert MIN_WARMUP == 1
    assert [(s.step, s.warmup) for s in steps] == [(0, True), (1, False), (2, False)]
    assert result.summary.steps_measured == 2  # the steps asked for are all measured
    # independently: the median of the steps after the first
    assert result.summary.median_step_ms == statistics.median(s.step_ms for s in steps[1:])
    assert WARMUP_RAISED_NOTE in result.notes


def test_a_stated_warmup_is_kept_and_not_noted():
    result, steps = _trial(warmup=2)
    assert [s.warmup for s in steps] == [True, True, False, False]
    assert WARMUP_RAISED_NOTE not in result.notes


def test_the_h200_fp8_eager_median_held_its_first_step():
    """What the rule changes on the real run: 4 measured steps with no warm-up put the
    212 ms first step into the median (158.9 ms); it belongs to the warm-up."""
    trial = read_run(FP8_EAGER).trials[0]
    times = [s.step_ms for s in trial.steps]
    assert round(times[0]) == 212 and not trial.steps[0].warmup
    assert round(trial.summary.median_step_ms, 2) == 158.93
    steps = [dataclasses.replace(trial.steps[0], warmup=True), *trial.steps[1:]]
    summary = summarise(steps, tokens_per_step=8 * 1024, model_flops_per_step=None,
                        counted_flops_per_step=None, peak=None)
    assert summary.median_step_ms == statistics.median(times[1:]) < 0.75 * times[0]


def test_cli_progress_counts_the_warmup_step(tmp_path):
    proc = subprocess.run(
        [sys.executable, "main.py", "profile", "--model", "tiny", "--batch-size", "1",
         "--seq-len", "16", "--steps", "2", "--warmup", "0", "--device", "cpu",
         "--precision", "fp32", "--isolation", "inline", "--no-kernel-profile"],
        cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = [line.split()[:3] for line in proc.stderr.splitlines() if " fp32 " in f" {line}"]
    assert ["fp32", "warm-up", "1/3"] in lines and ["fp32", "step", "3/3"] in lines
