"""Figures a user compares across recipes: a compiled trial's peak memory is its compiled
steps' (not the eager memory step's), every table says per trial whether it ran compiled,
and MFU has one common denominator beside each recipe's own peak. Fed with the real H200
reports (tests/data/h200-2026-11-27/reports) and checked on the CPU through the CLI."""

import dataclasses
import json
import statistics
from csv import DictReader

import pytest

from engine.measure.peaks import common_peak
from engine.record.compare import comparison_rows, format_table
from engine.record.journal import read_run
from engine.record.summary import summarise
from engine.report.csv_io import comparison_path
from engine.run.timed_memory import timed_peak
from tests.cli_in_process import run_cli
from tests.engine import h200


def _resummarised(trial, compiled, peak=None):
    """The trial's summary made again from its own steps, as the trial makes it now."""
    memory, reason = timed_peak(trial.memory, compiled)
    return summarise(trial.steps, tokens_per_step=8 * 1024,
                     model_flops_per_step=trial.flops.analytic_per_step,
                     counted_flops_per_step=trial.flops.counted_per_step, peak=None,
                     memory=memory, memory_reason=reason, common_peak=peak)


@pytest.mark.parametrize(("report", "eager_gb", "compiled_gb"),
                         [("02-gpt2-bf16-amp.json", 13.07, 7.12),
                          ("02-gpt2-fp8.json", 12.90, 6.10)])
def test_a_compiled_trial_reports_its_compiled_steps_peak_h200(report, eager_gb, compiled_gb):
    trial = h200.report(report).trials[0]
    assert trial.memory.total_bytes / 1e9 == pytest.approx(eager_gb, abs=0.01)  # eager step
    # independently: the allocator's peak each measured step recorded
    timed = max(s.allocated_bytes for s in trial.steps if not s.warmup)
    assert timed / 1e9 == pytest.approx(compiled_gb, abs=0.01)
    summary = _resummarised(trial, compiled=True)
    assert summary.peak_memory_bytes == timed
    assert "compiled measured steps" in summary.peak_memory_method
    assert f"{eager_gb:.2f} GB" in summary.peak_memory_method  # the eager figure is named
    # an eager trial's watched step ran as its timed steps did: its peak stands
    assert _resummarised(trial, compiled=False).peak_memory_bytes == trial.memory.total_bytes


def test_the_verdicts_memory_saving_reads_the_compiled_peak_h200():
    sweep = h200.report(h200.SWEEP)
    fp32 = sweep.trial("fp32")
    bf16 = h200.report("02-gpt2-bf16-amp.json").trials[0]
    bf16 = dataclasses.replace(bf16, summary=_resummarised(bf16, compiled=True), compiled=True)
    record = dataclasses.replace(sweep, trials=[fp32, bf16])
    rows = {r.precision: r for r in comparison_rows(record)}
    expected = 1 - 7124083712 / fp32.summary.peak_memory_bytes
    assert rows["bf16-amp"].memory_saving_vs_fp32 == pytest.approx(expected)
    assert rows["bf16-amp"].compiled is True and rows["fp32"].compiled is None  # older report
    # the terminal table says it below the rows (a column would not fit 120 characters)
    assert "  compiled (torch.compile): bf16-amp" in format_table(list(rows.values()))
    wide = format_table(list(rows.values()), wide=True).splitlines()
    column = wide[0].index("Compiled")
    assert [line[column:column + 8].strip() for line in wide[2:]] == ["n/a", "yes"]


def test_common_mfu_ranks_recipes_as_their_speed_does_h200():
    sweep = h200.report(h200.SWEEP)
    peak = common_peak(sweep.environment["device"]["name"])
    assert peak.flops_per_s == pytest.approx(989.4e12)  # H200 SXM, bf16 dense
    common, own = {}, {}
    for trial in sweep.trials:
        summary = _resummarised(trial, compiled=False, peak=peak)
        # independently: model FLOPs over the median measured step, over 989.4 TFLOP/s
        median_s = statistics.median(s.step_ms for s in trial.steps if not s.warmup) / 1e3
        expected = trial.flops.analytic_per_step / median_s / 989.4e12
        assert summary.mfu_common == pytest.approx(expected, rel=1e-9)
        common[trial.precision], own[trial.precision] = summary.mfu_common, trial.summary.mfu
    # each recipe's own peak ranks fp32 (0.61 of the 67 TFLOP/s CUDA-core rate) above
    # bf16-amp (0.12 of 989.4) while fp32 is 2.9x slower; the common column does not
    assert own["fp32"] == pytest.approx(0.611, abs=1e-3)
    assert own["bf16-amp"] == pytest.approx(0.122, abs=1e-3)
    assert common["bf16-amp"] > common["fp32"]
    by_speed = sorted(sweep.trials, key=lambda t: t.summary.median_step_ms)
    assert sorted(common, key=common.get, reverse=True) == [t.precision for t in by_speed]


def test_common_peak_is_na_with_a_reason_where_there_is_none():
    assert common_peak(None).flops_per_s is None
    assert "CPU" in common_peak(None).reason
    assert "no datasheet peak for 'Mystery GPU'" in common_peak("Mystery GPU").reason
    assert common_peak("Tesla V100-SXM2-16GB").source.startswith("common reference")  # fp16
    mig = common_peak("NVIDIA H100 80GB HBM3 MIG 3g.40gb", sm_count=66, mig=True)
    assert mig.flops_per_s == pytest.approx(989.4e12 * 66 / 132)


def _profile(tmp_path, *args):
    out = tmp_path / "r.json"
    # in this process: its trials still run in child processes (spawned ``profile``:
    # test_cli_spread; spawned ``report``: test_cli_lost_updates)
    proc = run_cli("profile", "--model", "tiny", "--batch-size", "2", "--seq-len", "32",
                   "--steps", "2", "--device", "cpu", "--no-kernel-profile", "--out", str(out),
                   *args)
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads(out.read_text()), read_run(out)


def test_cpu_eager_trials_say_eager_and_common_mfu_is_na_with_the_reason(tmp_path):
    proc, raw, record = _profile(tmp_path, "--precision", "fp32,bf16-amp", "--warmup", "1")
    for trial in raw["trials"]:
        assert trial["compiled"] is False
        assert trial["summary"]["mfu_common"] is None
        assert "no datasheet peak for CPUs" in trial["summary"]["mfu_common_reason"]
        assert trial["summary"]["peak_memory_bytes"] > 0  # eager: the watched step's peak
    assert "compiled (torch.compile)" not in proc.stdout  # nothing compiled: nothing said
    assert "vs common 16-bit peak" in proc.stdout
    assert "MFU vs common 16-bit peak n/a: no common 16-bit Tensor Core peak" in proc.stdout
    assert [r.compiled for r in comparison_rows(record)] == [False, False]


def test_cpu_compiled_trial_says_compiled_and_its_peak_is_na_not_the_eager_steps(tmp_path):
    proc, raw, record = _profile(tmp_path, "--precision", "fp32", "--warmup", "1",
                                 "--compile")
    trial = raw["trials"][0]
    assert trial["status"] == "ok" and trial["compiled"] is True
    summary = trial["summary"]
    assert summary["peak_memory_bytes"] is None
    eager = trial["memory"]["total_bytes"]
    assert eager > 0 and f"{eager / 1e9:.2f} GB" in summary["peak_memory_method"]
    assert "compiled steps' peak cannot be read" in summary["peak_memory_method"]
    assert "  compiled (torch.compile): fp32\n" in proc.stdout
    html, csv = tmp_path / "r.html", tmp_path / "r.csv"
    for out in (html, csv):
        written = run_cli("report", str(tmp_path / "r.json"), "--out", str(out))
        assert written.returncode == 0, written.stderr
    assert "<th>Compiled</th>" in html.read_text()
    with comparison_path(csv).open(newline="") as fh:
        assert next(DictReader(fh))["compiled"] == "True"
