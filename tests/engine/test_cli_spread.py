"""The real ``python3 main.py profile`` shows the spread, interleaves and passes --init-scale."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.record.compare import format_cell

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("spread") / "run.json"
    run = subprocess.run(
        [sys.executable, "main.py", "profile", "--model", "tiny", "--precision", "fp32,bf16-amp",
         "--batch-size", "1", "--seq-len", "16", "--steps", "10", "--warmup", "1",
         "--device", "cpu", "--isolation", "inline", "--interleave", "on", "--rounds", "2",
         "--numerics", "--init-scale", "1024", "--out", str(out), "--quiet", "--wide"],
        cwd=ROOT, capture_output=True, text=True,
        # the test session's data and cache folders (tests/conftest.py), not the user's
        env={"OMP_NUM_THREADS": "1", "PATH": "",
             **{k: os.environ[k] for k in ("AMPSCOPE_DATA_DIR", "AMPSCOPE_CACHE_DIR")}},
    )
    assert run.returncode == 0, run.stderr
    return run.stdout, json.loads(out.read_text())


def _measured(trial):
    return np.array([s["step_ms"] for s in trial["steps"] if not s["warmup"]])


def test_table_shows_the_spread_columns(profiled):
    stdout, report = profiled
    lines = stdout.splitlines()
    header = next(line for line in lines if line.startswith("Precision"))
    for column in ("Step p10..p90", "Step CV", "Throughput 95% CI", "Speed-up 95% CI",
                   "Speed-up verdict"):
        assert column in header
    for trial in report["trials"]:
        x = _measured(trial)
        row = next(line for line in lines if line.startswith(trial["precision"] + " "))
        p10, p90 = np.percentile(x, [10, 90])
        assert format_cell("step_ms_p10_p90", (p10, p90)) in row
        assert format_cell("step_ms_cv", np.std(x, ddof=1) / np.mean(x)) in row
    verdict = report["comparison"]["speed_verdict"]
    assert f"speed: {verdict['text']}" in stdout
    if verdict["status"] == "noisy":  # this machine is shared: noisy runs must say so
        assert "suggestion:" in stdout and "noisy: not significant" in stdout


def test_rounds_ran_mirrored_and_were_combined(profiled):
    _, report = profiled
    assert report["config"]["interleave"] == "on"
    fp32, bf16 = report["trials"]
    for trial in (fp32, bf16):
        assert [s["round"] for s in trial["steps"]] == [0] * 6 + [1] * 6
        assert [s["step"] for s in trial["steps"]] == list(range(12))
        assert trial["summary"]["steps_measured"] == 10
        assert trial["summary"]["spread"]["rounds"] == 2
        assert trial["summary"]["median_step_ms"] == pytest.approx(np.median(_measured(trial)))

    def span(trial, r):
        times = [s["time_s"] for s in trial["steps"] if s["round"] == r]
        return min(times), max(times)

    # mirrored: fp32 round 1, bf16 round 1, bf16 round 2, fp32 round 2
    order = [span(fp32, 0), span(bf16, 0), span(bf16, 1), span(fp32, 1)]
    assert all(a[1] < b[0] for a, b in zip(order, order[1:]))


def test_numerics_lab_uses_the_given_initial_scale(profiled):
    _, report = profiled
    assert report["numerics"]["gradients"]["loss_scale"] == 1024.0


def test_json_and_csv_comparison_agree(profiled, tmp_path):
    _, report = profiled
    rows = {r["precision"]: r for r in report["comparison"]["rows"]}
    fp32, bf16 = report["trials"]
    ratio = np.median(_measured(fp32)) / np.median(_measured(bf16))
    assert rows["bf16-amp"]["speedup_vs_fp32"] == pytest.approx(ratio)
    low, high = rows["bf16-amp"]["speedup_ci"]
    assert low <= ratio <= high
    assert "bootstrap" in report["comparison"]["spread_method"]
    # each round (1 warm-up + 5 steps) draws its batches from the same seeded pool of 8
    assert bf16["summary"]["distinct_batches"] == 6
    # the same run as CSV: steps with their round, and the comparison table beside them
    from engine.record.run_record import RunRecord
    from engine.report.writer import write_report

    write_report(RunRecord.from_dict(report), tmp_path / "run.csv")
    with (tmp_path / "run.comparison.csv").open(newline="", encoding="utf-8") as fh:
        table = {r["precision"]: r for r in csv.DictReader(fh)}
    assert (table["bf16-amp"]["speedup_ci_low"], table["bf16-amp"]["speedup_ci_high"]) == (
        str(low), str(high))
    assert table["bf16-amp"]["run_speed_verdict"] == report["comparison"]["speed_verdict"]["text"]
