"""scripts/gpu_acceptance.py's logic on the CPU: its bands fed with what the H200 measured
(tests/data/h200-2026-11-27), its budget, the memory prediction its OOM check asks first,
and a run cut short keeping the checks it had decided."""

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from engine.core.events import MonitorSample
from engine.measure.peaks import common_peak
from engine.record.journal import read_run
from engine.record.summary import summarise
from engine.run.timed_memory import timed_peak
from tests.engine import h200

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_acceptance as acc  # noqa: E402


def _by_name(checks):
    return {c.name: c for c in checks}


def _as_now(trial, compiled):
    """The trial summarised as the engine does now: the common MFU, the timed steps' peak."""
    memory, reason = timed_peak(trial.memory, compiled)
    summary = summarise(trial.steps, tokens_per_step=8 * 1024,
                        model_flops_per_step=trial.flops.analytic_per_step,
                        counted_flops_per_step=trial.flops.counted_per_step,
                        peak=None, memory=memory, memory_reason=reason,
                        common_peak=common_peak("NVIDIA H200"))
    summary = dataclasses.replace(summary, mfu=trial.summary.mfu)
    return dataclasses.replace(trial, summary=summary, compiled=compiled)


def test_every_band_is_under_2x_wide_and_holds_what_the_h200_measured():
    measured = {"MFU_BAND": 0.122, "COMPILED_MFU_BAND": 0.303, "MM_BAND": 0.809,
                "TIMER_BAND": 0.986, "FLOPS_RATIO_BAND": 1.002}
    for name, value in measured.items():
        low, high = getattr(acc, name)
        assert low <= value <= high and high / low < 2, name
    assert acc.TF32_MIN_SPEEDUP <= 2.21 and acc.FP8_MIN <= 0.999
    assert 7.12 / 13.07 <= acc.COMPILED_PEAK_MAX < 1  # an eager step's peak reads 1.0


def test_sweep_checks_pass_on_the_h200_sweep():
    record = h200.report(h200.SWEEP)
    checks = _by_name(acc.sweep_checks(record))
    for name in ("GPT-2 124M, batch 8 x 1024: every recipe runs",
                 "counted FLOPs identical across recipes", "bf16-amp MFU, eager",
                 "tf32 speed-up over fp32 (median step time)",
                 "no MFU above 1 (any step of any recipe)"):
        assert checks[name].passed is True, checks[name]
    assert checks["bf16-amp MFU, eager"].measured == "0.122"
    assert checks["tf32 speed-up over fp32 (median step time)"].measured == "2.21x"
    # that report has no common MFU: the check says so and fails; summarised as the engine
    # does now, the common column ranks the recipes as their speed does
    common = "MFU vs common 16-bit peak ranks recipes as step time does"
    assert checks[common].passed is False and checks[common].measured.startswith("n/a")
    now = dataclasses.replace(record, trials=[_as_now(t, False) for t in record.trials])
    again = _by_name(acc.sweep_checks(now))[common]
    assert again.passed is True
    assert again.measured.startswith("bf16 ") and again.measured.split(", ")[-1].startswith(
        "fp32 ")


@pytest.mark.parametrize(("report", "label"), [("02-gpt2-bf16-amp.json", "bf16-amp"),
                                               ("02-gpt2-fp8.json", "fp8")])
def test_compiled_peak_check_fails_the_recorded_eager_peak_and_passes_the_fix(report, label):
    trial = h200.report(report).trials[0]
    assert acc.compiled_peak_check(trial, label).passed is False  # the bug as recorded
    fixed = acc.compiled_peak_check(_as_now(trial, True), label)
    assert fixed.passed is True and "compiled True" in fixed.measured


def test_compiled_mfu_and_fp8_share_pass_on_the_h200_runs():
    bf16 = h200.report("02-gpt2-bf16-amp.json")
    assert acc.compiled_check(bf16)[0].passed is True
    fp8 = h200.report("02-gpt2-fp8.json").trials[0]
    share = acc.fp8_share_check(fp8, 8 * 1024)
    assert share.passed is True and share.measured.startswith("0.999")


def test_the_nvml_check_fails_the_nan_the_h200_gpm_returned():
    # as NVML gave them: the middle one's idle GPM window answered NaN
    raw = h200.raw("02-gpt2-bf16-amp.json")["monitor_samples"][278:281]
    samples = [MonitorSample(**m) for m in raw]
    assert math.isnan(samples[1].gpm_dram_bw_util_pct)
    record = h200.report("02-gpt2-bf16-amp.json")
    gpm = _by_name(acc.nvml_check(dataclasses.replace(record, monitor_samples=samples)))
    check = gpm["NVML GPM fields finite or n/a"]
    assert check.passed is False and "gpm_dram_bw_util_pct" in check.measured
    clean = [samples[0], samples[2]]
    again = acc.nvml_check(dataclasses.replace(record, monitor_samples=clean))
    assert _by_name(again)["NVML GPM fields finite or n/a"].passed is True


def test_the_oom_check_asks_the_memory_model_first():
    @dataclasses.dataclass
    class H200:
        total_memory_bytes: int = 150109880320  # as the H200 reported it

    batch, said = acc.oom_batch(H200())
    # independently: fp32 GPT-2 at batch 8 x 1024 held 14.95 GB on the H200; what does not
    # grow with the batch is 16 B per parameter (fp32 weights, gradients, AdamW's two
    # moments: 124,439,808 unique parameters, the head tied to the embedding), the rest
    # grows with it; 1.5 x 150.1 GB is reached between batch 128 and 256
    static = 16 * 124_439_808
    per_sample = (14946363392 - static) / 8
    assert batch == 2 ** math.ceil(math.log2((acc.OOM_MARGIN * H200().total_memory_bytes
                                              - static) / per_sample))
    assert batch == 256 and said.startswith("batch 256 x 1024: predicted")
    # the engine's own pre-run check (what profile refuses by) agrees, here on the CPU's RAM
    refused = acc.oom_refusal(batch, "cpu")
    assert refused.predicted_bytes >= acc.OOM_MARGIN * H200().total_memory_bytes
    assert refused.fits is (refused.predicted_bytes <= refused.free_bytes)


def test_groups_past_the_budget_are_skipped_and_said_and_the_last_keeps_its_time(tmp_path):
    results = acc.Results(tmp_path, "cpu")
    ran = []

    def group(name):
        return lambda: ran.append(name) or [acc.Check(name, "x", "y", True)]

    checks = acc.run_groups([("a", 10, group("a")), ("too long", 100, group("too long")),
                             ("last", 20, group("last"))], results, budget_s=60)
    assert ran == ["a", "last"]
    skipped = _by_name(checks)["too long"]
    assert skipped.passed is None and skipped.measured.startswith("not run:")
    saved = json.loads((tmp_path / "cpu-acceptance.json").read_text())["checks"]
    assert [c["name"] for c in saved] == ["a", "too long", "last"]


CUT_SHORT = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {scripts!r})
import gpu_acceptance as acc

results = acc.Results(Path({out!r}), "cpu")
acc.RESULTS = results
record = acc._run(model="tiny", device="cpu", precisions=("fp32",), batch_size=1, seq_len=16,
                  steps=1, warmup=1, isolation="inline", profile_step=False)
first = lambda: [acc.Check("first", "ok", record.trials[0].status, True)]
killed = lambda: os.kill(os.getpid(), signal.SIGKILL)
acc.run_groups([("one", 5, first), ("two", 5, killed), ("three", 5, first)], results, 60)
"""


def test_a_run_cut_short_keeps_its_decided_checks_and_every_report(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-c", CUT_SHORT.format(scripts=str(ROOT / "scripts"), out=str(out))],
        cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == -9  # killed in its second group
    assert "    CHECK first | ok | ok | True" in proc.stdout  # printed as it was decided
    saved = json.loads((out / "cpu-acceptance.json").read_text())["checks"]
    assert [(c["name"], c["passed"]) for c in saved] == [("first", True)]
    assert "| first | ok | ok | pass |" in (out / "cpu-acceptance.md").read_text()
    reports = sorted((out / "reports").iterdir())
    assert [p.name for p in reports] == ["01-tiny-fp32.json"]
    assert read_run(reports[0]).trials[0].status == "ok"
