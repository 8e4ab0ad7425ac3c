"""The run journal: what a run writes, how compact it is, and reading any journal back."""

import dataclasses
import json
import os

import pytest

from engine.core.config import RunConfig
from engine.core.events import MonitorSample, StepSample
from engine.record.journal import (
    data_dir,
    journal_entries,
    journal_path,
    read_journal,
    read_run,
    runs_dir,
)
from engine.record.json_report import read_json
from engine.report.writer import write_report
from engine.run.runner import Runner


@pytest.fixture(scope="module")
def finished_run():
    """A real run (tiny preset, CPU, inline) and its journal."""
    config = RunConfig(model="tiny", precisions=("fp32", "bf16", "tf32"), batch_size=1,
                       seq_len=16, steps=3, warmup=1, device="cpu", isolation="inline")
    runner = Runner(config)
    record = runner.run()
    return record, runner.journal_path


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_tests_write_journals_into_a_temporary_data_folder(finished_run):
    _, path = finished_run
    assert "ampscope-test-data-" in str(data_dir())
    assert path == journal_path(path.stem) and path.parent == runs_dir()


def test_journal_rebuilds_the_same_run(finished_run):
    record, path = finished_run
    back = read_journal(path)
    assert back.run_id == record.run_id and back.status == "ok"
    as_json = json.loads(json.dumps(record.config))  # tuples in the config become lists
    assert back.config == as_json and back.environment == record.environment
    assert back.trials == record.trials  # steps, memory, dtype map, summary: all of it
    assert [t.status for t in back.trials] == ["ok", "ok", "unsupported"]
    assert back.logs == record.logs
    assert len(back.monitor_samples) == len(record.monitor_samples)
    for ours, live in zip(back.monitor_samples, record.monitor_samples, strict=True):
        # times are kept to the millisecond; everything else exactly
        assert ours.time_s == pytest.approx(live.time_s, abs=5e-4)
        assert dataclasses.replace(ours, time_s=live.time_s) == live


def test_journal_is_compact(finished_run):
    record, path = finished_run
    lines = _lines(path)
    monitor = [x for x in lines if x["e"] == "mon"]
    assert monitor and all("gpu_util_pct" not in x and "gu" not in x for x in monitor)
    done = [x for x in lines if x["e"] == "done"]
    # a finished trial's steps are the step lines above it, not written a second time
    assert {x["result"]["steps"] for x in done if x["result"]["status"] == "ok"} == {"journal"}
    steps = [x for x in lines if x["e"] == "step"]
    assert len(steps) == sum(len(t.steps) for t in record.trials)
    assert all(None not in x.values() for x in lines)
    report = json.dumps(record.to_dict(), indent=1)
    assert path.stat().st_size < len(report)


def test_a_cut_journal_is_an_interrupted_run_with_what_it_measured(finished_run, tmp_path):
    record, path = finished_run
    lines = path.read_text().splitlines()
    # cut after bf16's second step, mid-way through the next line
    step_lines = [i for i, x in enumerate(lines) if '"e":"step"' in x and '"bf16"' in x]
    cut = step_lines[1]
    partial = tmp_path / "cut.jsonl"
    partial.write_text("\n".join(lines[: cut + 1]) + "\n" + lines[cut + 1][:25])
    back = read_journal(partial)
    assert back.status == "interrupted" and back.finished_s is None
    assert back.trial("fp32") == record.trial("fp32")
    bf16 = back.trial("bf16")
    assert bf16.status == "cancelled" and "interrupted" in bf16.reason
    assert [s.step for s in bf16.steps] == [0, 1]
    assert bf16.summary.steps_measured == 1  # step 0 is the warm-up
    assert bf16.summary.median_step_ms == bf16.steps[1].step_ms
    assert bf16.summary.mfu is None and "interrupted" in bf16.summary.mfu_reason
    assert back.trial("tf32") is None  # never started
    for ext in ("json", "csv", "html"):  # any journal into any report
        write_report(back, tmp_path / f"r.{ext}")
    assert read_json(tmp_path / "r.json").trial("bf16").steps == bf16.steps


def test_damaged_journals_say_what_is_wrong(finished_run, tmp_path):
    _, path = finished_run
    lines = path.read_text().splitlines()
    middle = tmp_path / "middle.jsonl"
    middle.write_text("\n".join(lines[:3] + ["{not json"] + lines[3:]) + "\n")
    with pytest.raises(ValueError, match="line 4 is damaged"):
        read_journal(middle)
    other = tmp_path / "other.jsonl"
    other.write_text('{"hello": 1}\n')
    with pytest.raises(ValueError, match="not an AmpScope run journal"):
        read_journal(other)
    newer = tmp_path / "newer.jsonl"
    newer.write_text('{"e":"journal","version":99}\n')
    with pytest.raises(ValueError, match="update AmpScope"):
        read_journal(newer)
    with pytest.raises(ValueError, match="not found"):
        read_run(tmp_path / "missing.jsonl")


def test_step_and_monitor_values_survive_the_short_form():
    from engine.record.journal import decode, encode

    step = StepSample("fp16", 3, False, float("inf"), 12.5, 1000.0, None, None, 10, 20,
                      1024.0, True, float("nan"), 1.5)
    line = json.loads(json.dumps(encode(step)))
    back = decode(line, {})
    assert back.loss == float("inf") and back.grad_norm != back.grad_norm  # NaN kept
    assert dataclasses.replace(back, grad_norm=0.0) == dataclasses.replace(step, grad_norm=0.0)
    sample = MonitorSample(time_s=1.0, source="nvml", gpu_util_pct=97.0, power_w=301.25,
                           energy_j=12345.678, gpu_mem_used_bytes=2**34)
    assert decode(json.loads(json.dumps(encode(sample))), {}) == sample


def test_entries_list_journals_not_in_the_database(finished_run):
    record, path = finished_run
    entries = {e.run_id: e for e in journal_entries()}
    assert entries[record.run_id].status == "ok"
    assert entries[record.run_id].precisions == ("fp32", "bf16", "tf32")
    assert record.run_id not in {e.run_id for e in journal_entries({record.run_id})}


def test_a_journal_that_cannot_be_written_does_not_stop_the_run(tmp_path, monkeypatch):
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(blocked))
    events = []
    config = RunConfig(model="tiny", precisions=("fp32",), batch_size=1, seq_len=16, steps=1,
                       warmup=0, device="cpu", isolation="inline")
    record = Runner(config, events.append).run()
    assert [t.status for t in record.trials] == ["ok"]
    warnings = [e.message for e in record.logs if e.level == "warning"]
    assert any("could not be written" in w and "without a journal" in w for w in warnings)


def test_numerics_appended_after_the_run_are_read_back(finished_run, tmp_path):
    from engine.record.journal import append_numerics

    _, path = finished_run
    copy = tmp_path / path.name
    copy.write_bytes(path.read_bytes())
    append_numerics(copy, {"model": "tiny", "precision": "bf16-amp"})
    back = read_journal(copy)
    assert back.status == "ok" and back.numerics == {"model": "tiny", "precision": "bf16-amp"}
    assert copy.read_text().count('"e":"journal"') == 1


def test_an_unfinished_journal_is_running_while_its_writer_lives(finished_run, tmp_path):
    import subprocess
    import sys

    from engine.record.journal import journal_entry

    _, path = finished_run
    lines = path.read_text().splitlines()
    body = [x for x in lines[1:] if '"e":"end"' not in x]
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for pid, status in ((os.getpid(), "running"), (gone.pid, "interrupted")):
        cut = tmp_path / f"{pid}.jsonl"
        cut.write_text("\n".join([json.dumps({"e": "journal", "version": 1, "pid": pid}),
                                  *body]) + "\n")
        assert journal_entry(cut).status == status
