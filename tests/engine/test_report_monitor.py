"""Reports keep a thinned monitor series (the journal keeps every poll), and old reports
with the full series still open."""

import bisect
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from engine.core.events import MonitorSample
from engine.record.json_report import parse_report

ROOT = Path(__file__).resolve().parents[2]


def test_profile_report_thins_the_monitor_series_the_journal_keeps(tmp_path):
    # child processes on purpose: each child's start-up is a window of many polls to thin
    out = tmp_path / "r.json"
    run = subprocess.run(
        [sys.executable, "main.py", "profile", "--model", "tiny", "--precision", "fp32,bf16",
         "--batch-size", "1", "--seq-len", "16", "--steps", "3", "--warmup", "1",
         "--device", "cpu", "--quiet", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "AMPSCOPE_DATA_DIR": str(tmp_path / "data"), "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr
    (journal,) = (tmp_path / "data" / "runs").glob("*.jsonl")
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    raw = [(line["t"], line.get("cpu"), line.get("rss")) for line in lines if line["e"] == "mon"]
    ends = sorted(line["time_s"] for line in lines if line["e"] == "step")
    report = json.loads(out.read_text())
    kept = [(round(m["time_s"], 3), m.get("cpu_pct"), m.get("host_rss_bytes"))
            for m in report["monitor_samples"]]
    assert "journal" in report["monitor_sampling"]
    assert 0 < len(kept) < len(raw)
    assert set(kept) <= set(raw)  # real polls, unchanged (the journal keeps ms times)
    # every window between two step ends keeps its last poll and its CPU and RSS extremes
    windows: dict[int, list] = {}
    for sample in raw:
        windows.setdefault(bisect.bisect_left(ends, sample[0]), []).append(sample)
    for window in windows.values():
        assert window[-1] in kept
        for i in (1, 2):
            values = [s[i] for s in window if s[i] is not None]
            if values:
                in_report = {s[i] for s in kept if s in window}
                assert min(values) in in_report and max(values) in in_report
    # no null fields written for what the host monitor cannot give
    assert all(None not in m.values() for m in report["monitor_samples"])

    # a report from before thinning (every poll, nulls written out) still opens
    old = dict(report)
    del old["monitor_sampling"]
    old["monitor_samples"] = [dataclasses.asdict(MonitorSample(
        time_s=t, source="host", cpu_pct=cpu, host_rss_bytes=rss)) for t, cpu, rss in raw]
    record = parse_report(json.dumps(old), "old.json")
    assert len(record.monitor_samples) == len(raw) and record.monitor_sampling is None
    assert [m.cpu_pct for m in record.monitor_samples] == [cpu for _, cpu, _ in raw]
