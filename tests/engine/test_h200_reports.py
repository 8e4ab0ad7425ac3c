"""The 11 JSON reports of AmpScope's first GPU run (an H200, tests/data/README.md) open.

Five hold NaN where NVML's GPM answered NaN for an idle window (``gpm_dram_bw_util_pct``):
``report`` opens them with those fields n/a and says once which file and fields it
repaired; the report it writes holds no NaN outside a loss or a gradient norm. Which
files hold which NaN is read here from the files themselves, not from the code under test.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import re
from pathlib import Path

import pytest

from engine.core.events import GpmMetrics, MonitorSample, StepSample
from engine.record.journal import JournalWriter, read_journal, read_run
from engine.record.validate import NONFINITE_FIELDS
from engine.report.json_io import write_json
from tests.cli_in_process import run_cli

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "tests" / "data" / "h200-2026-11-27" / "reports"
NAMES = sorted(p.name.removesuffix(".gz") for p in REPORTS.glob("*.json.gz"))


def unpack(name: str, folder: Path) -> Path:
    path = folder / name
    path.write_bytes(gzip.decompress((REPORTS / f"{name}.gz").read_bytes()))
    return path


def nonfinite_fields(text: str) -> dict[str, int]:
    """Each field that holds NaN/Infinity outside a loss or grad norm, list positions
    folded, and how many times: an independent walk of the parsed file."""
    found: dict[str, int] = {}

    def walk(v, key, where):
        if isinstance(v, dict):
            for k, x in v.items():
                walk(x, k, f"{where}.{k}" if where else k)
        elif isinstance(v, list):
            for x in v:
                walk(x, key, f"{where}[]")
        elif isinstance(v, float) and not math.isfinite(v) and key not in NONFINITE_FIELDS:
            found[where] = found.get(where, 0) + 1

    walk(json.loads(text), "", "")
    return found


def strict(text: str):
    """Parse refusing NaN / Infinity anywhere but a loss or a gradient norm."""
    def hook(pairs):
        for key, value in pairs:
            if isinstance(value, float) and not math.isfinite(value):
                assert key in NONFINITE_FIELDS, f"{key} holds {value}"
        return dict(pairs)
    return json.loads(text, object_pairs_hook=hook)


def test_the_real_files_are_all_here():
    assert len(NAMES) == 11
    damaged = [n for n in NAMES
               if nonfinite_fields(gzip.decompress((REPORTS / f"{n}.gz").read_bytes()).decode())]
    assert len(damaged) == 5  # as the run's README says


@pytest.mark.parametrize("name", NAMES)
def test_report_opens_each_real_h200_report(name, tmp_path):
    path = unpack(name, tmp_path)
    bad = nonfinite_fields(path.read_text())
    out = tmp_path / "out.json"
    # in this process (the spawned ``report`` of a real H200 file: test_cli_lost_updates)
    run = run_cli("report", str(path), "--out", str(out))
    assert run.returncode == 0, run.stderr
    assert "written to" in run.stdout
    if bad:
        assert run.stderr.count("repaired") == 1, run.stderr  # said once
        assert str(path) in run.stderr
        folded = re.sub(r"\[\d+\]", "[]", run.stderr)  # a lone value keeps its index
        for field in bad:
            assert field in folded
    else:
        assert "repaired" not in run.stderr
    written = out.read_text()
    strict(written)  # no NaN outside a loss or grad norm
    again = read_run(out)
    assert again.repaired is None
    original = json.loads(path.read_text())
    assert [t.precision for t in again.trials] == [t["precision"] for t in original["trials"]]
    assert [t.status for t in again.trials] == [t["status"] for t in original["trials"]]


def test_a_repaired_field_reads_as_na_and_the_rest_as_written(tmp_path):
    path = unpack("04-gpt2-fp32.json", tmp_path)
    original = json.loads(path.read_text())
    record = read_run(path)
    (trial,) = record.trials
    raw = original["trials"][0]["gpm"]
    assert math.isnan(raw["dram_bw_util_pct"])
    assert trial.gpm.dram_bw_util_pct is None
    assert trial.gpm.sm_util_pct == raw["sm_util_pct"]
    assert record.repaired.startswith(f"{path} was repaired on reading")
    assert "trials[0].gpm.dram_bw_util_pct" in record.repaired
    assert record.logs[-1].level == "warning" and record.logs[-1].message == record.repaired


def test_a_nan_step_time_is_still_refused_naming_it(tmp_path):
    """A NaN where a number is required is damage: refused, not read as n/a."""
    path = unpack("06-gpt2-fp32.json", tmp_path)
    data = json.loads(path.read_text())
    data["trials"][0]["steps"][1]["step_ms"] = math.inf
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"steps\[1\]\.step_ms: inf is not a valid value"):
        read_run(path)


def _step(loss: float) -> StepSample:
    return StepSample(precision="fp16", step=0, warmup=False, loss=loss, step_ms=10.0,
                      tokens_per_s=None, tflops=None, mfu=None, allocated_bytes=None,
                      reserved_bytes=None, loss_scale=None, skipped=False, grad_norm=None,
                      time_s=1.0)


def test_the_report_writer_writes_a_hardware_nan_as_null_and_keeps_a_diverged_loss(tmp_path):
    record = read_run(unpack("06-gpt2-fp32.json", tmp_path))
    trial = record.trials[0]
    steps = [dataclasses.replace(trial.steps[0], loss=math.nan), *trial.steps[1:]]
    nan_gpm = GpmMetrics(sm_util_pct=1.0, dram_bw_util_pct=math.nan, window_s=1.0)
    record.trials[0] = dataclasses.replace(trial, steps=steps, gpm=nan_gpm)
    record.monitor_samples.append(MonitorSample(time_s=2.0, source="nvml",
                                                gpm_dram_bw_util_pct=math.inf))
    out = write_json(record, tmp_path / "out.json")
    data = strict(out.read_text())
    assert math.isnan(data["trials"][0]["steps"][0]["loss"])  # a measurement: kept
    assert data["trials"][0]["gpm"]["dram_bw_util_pct"] is None
    assert data["trials"][0]["gpm"]["sm_util_pct"] == 1.0
    assert data["monitor_samples"][-1].get("gpm_dram_bw_util_pct") is None
    note = data["logs"][-1]["message"]
    assert "trials[0].gpm.dram_bw_util_pct" in note
    assert "monitor_samples[" in note and "gpm_dram_bw_util_pct" in note
    assert read_run(out).repaired is None  # nothing left to repair


def test_the_journal_writer_writes_a_hardware_nan_as_null_said_once(tmp_path):
    from engine.core.events import RunStarted

    path = tmp_path / "run.jsonl"
    writer = JournalWriter(path)
    writer.write(RunStarted(run_id="r1", config={"precisions": ["fp16"]}, environment={},
                            time_s=1.0))
    for i in range(3):
        writer.write(MonitorSample(time_s=1.0 + i, source="nvml", gpm_sm_util_pct=5.0,
                                   gpm_dram_bw_util_pct=math.nan))
    writer.write(_step(math.inf))
    writer.close()
    assert writer.error is None  # the run's journal went on
    lines = path.read_text().splitlines()
    for line in lines:
        strict(line)
    warnings = [json.loads(x) for x in lines if '"e": "log"' in x or '"e":"log"' in x]
    assert len(warnings) == 1 and "gpm_dram_bw_util_pct" in warnings[0]["message"]
    record = read_journal(path)
    assert [m.gpm_dram_bw_util_pct for m in record.monitor_samples] == [None] * 3
    assert [m.gpm_sm_util_pct for m in record.monitor_samples] == [5.0] * 3
    assert record.steps("fp16")[0].loss == math.inf
    assert record.repaired is None


def test_a_journal_an_older_writer_left_nan_in_opens_with_the_note(tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_text(
        '{"e":"journal","version":1,"pid":1}\n'
        '{"e":"run","run_id":"r1","config":{},"environment":{},"time_s":1.0}\n'
        '{"e":"mon","t":1.5,"src":"nvml","sa":3.0,"db":NaN}\n'
        '{"e":"mon","t":1.6,"src":"nvml","sa":4.0,"db":NaN}\n')
    record = read_run(path)
    assert [m.gpm_dram_bw_util_pct for m in record.monitor_samples] == [None, None]
    assert [m.gpm_sm_util_pct for m in record.monitor_samples] == [3.0, 4.0]
    assert "mon.gpm_dram_bw_util_pct (2 values)" in record.repaired
    assert str(path) in record.repaired
