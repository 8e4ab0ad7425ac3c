"""A read journal's monitor columns become the same chart curves as the per-poll path."""

import dataclasses
import random

import numpy as np

from engine.core.events import MonitorSample, RunStarted, StepSample, TrialStarted
from engine.record.journal import JournalWriter, read_journal
from gui.live_charts import gpm_reasons, record_series


def _journal(path):
    rng = random.Random(5)
    maybe = lambda value: None if rng.random() < 0.3 else value  # noqa: E731
    writer = JournalWriter(path)
    t = 1_800_000_000.0
    writer.write(RunStarted("charts", {"model": "tiny", "precisions": ["bf16"]}, {}, t))
    writer.write(TrialStarted("bf16", 0, 1, t))
    for i in range(400):
        t += 0.1
        writer.write(MonitorSample(
            t, rng.choice(["nvml", "host"]), gpu_util_pct=maybe(rng.uniform(0, 100)),
            mem_util_pct=maybe(rng.uniform(0, 100)), gpu_mem_used_bytes=maybe(rng.randrange(2**34)),
            power_w=maybe(rng.uniform(50, 700)), process_mem_bytes=maybe(rng.randrange(2**33)),
            cpu_pct=maybe(rng.uniform(0, 200)), host_rss_bytes=maybe(rng.randrange(2**33)),
            host_mem_used_bytes=maybe(rng.randrange(2**35)),
            gpm_tensor_any_util_pct=maybe(rng.uniform(0, 100)) if i > 100 else None,
            gpm_dram_bw_util_pct=maybe(rng.uniform(0, 100)),
            gpm_reason="GPM needs Hopper or newer" if i in (3, 250) else None))
        if i % 10 == 9:
            writer.write(StepSample("bf16", i // 10, False, 2.0, 50.0, 100.0, 1.0, 0.1, 10, 20,
                                    None, False, 0.5, t))
    writer.close()


def test_monitor_columns_draw_the_curves_the_per_poll_path_draws(tmp_path):
    path = tmp_path / "charts.jsonl"
    _journal(path)
    record = read_journal(path)
    # the same polls as plain events go through monitor_points one poll at a time
    as_list = dataclasses.replace(record, monitor_samples=list(record.monitor_samples))
    ours, theirs = record_series(record, ["bf16"]), record_series(as_list, ["bf16"])
    assert [(s.style.chart, s.style.name, s.style.color) for s in ours] == \
        [(s.style.chart, s.style.name, s.style.color) for s in theirs]
    assert {s.style.chart for s in ours} >= {"monitor_util", "monitor_memory", "monitor_gpm"}
    for a, b in zip(ours, theirs, strict=True):
        assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y), a.style.name
    assert gpm_reasons(record.monitor_samples) == gpm_reasons(as_list.monitor_samples) == [
        "GPM needs Hopper or newer"] * 2
