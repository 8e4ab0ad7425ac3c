"""A long journal read back as columns: every step and monitor poll equals what was written,
field by field, through the reader's fast path and its full-schema fallback alike; and the
report's thinning of those columns keeps the polls the per-window rule names."""

import bisect
import dataclasses
import math
import random

import pytest

from engine.core.events import (
    MonitorSample,
    RunStarted,
    StepSample,
    TrialFinished,
    TrialResult,
    TrialStarted,
)
from engine.record.journal import JournalWriter, read_journal
from engine.report.thin import for_report, thin_samples

PRECISIONS = ("fp16-amp", "bf16")
STEPS = 2000  # per precision


def _step(rng: random.Random, precision: str, i: int, t: float) -> StepSample:
    maybe = lambda value: None if rng.random() < 0.2 else value  # noqa: E731
    return StepSample(
        precision=precision, step=i, warmup=i < 3,
        # an overflowed loss or gradient norm is journaled as it is (the fallback path)
        loss=float("nan") if i % 997 == 5 else maybe(rng.uniform(0, 12)),
        step_ms=rng.uniform(1, 900), tokens_per_s=maybe(rng.uniform(0, 1e6)),
        tflops=maybe(rng.uniform(0, 900)), mfu=maybe(rng.random()),
        allocated_bytes=maybe(rng.randrange(2**40)), reserved_bytes=maybe(rng.randrange(2**40)),
        loss_scale=maybe(2.0 ** rng.randrange(30)), skipped=rng.random() < 0.05,
        grad_norm=float("inf") if i % 1499 == 7 else maybe(rng.uniform(0, 50)),
        time_s=t, round=i % 3, hfu=maybe(rng.random()), tokens=maybe(rng.randrange(4096)),
        learning_rate=maybe(rng.uniform(0, 1e-3)), data_ms=maybe(rng.uniform(0, 5)),
        forward_ms=maybe(rng.uniform(0, 50)), backward_ms=maybe(rng.uniform(0, 90)),
        optimizer_ms=maybe(7),  # a whole number where a float goes: read back as a float
    )


def _poll(rng: random.Random, t: float, i: int) -> MonitorSample:
    maybe = lambda value: None if rng.random() < 0.3 else value  # noqa: E731
    return MonitorSample(
        time_s=t, source=rng.choice(["nvml", "host"]), gpu_util_pct=maybe(rng.uniform(0, 100)),
        gpu_mem_used_bytes=maybe(rng.randrange(2**36)), power_w=maybe(rng.uniform(50, 700)),
        energy_j=maybe(rng.uniform(0, 1e7)), cpu_pct=maybe(rng.uniform(0, 800)),
        host_rss_bytes=maybe(rng.randrange(2**35)),
        gpm_reason="GPM needs Hopper or newer" if i == 11 else None,
        load_avg_1m=maybe(rng.uniform(0, 8)), other_cpu_pct=maybe(rng.uniform(0, 100)))


def _same(a, b) -> bool:
    """Equal field by field, NaN equal to NaN (a NaN loss is journaled as it is)."""
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            continue
        if x != y or type(x) is not type(y):
            return False
    return True


@pytest.fixture(scope="module")
def long_journal(tmp_path_factory):
    """A journal of 4,000 steps and 12,000 polls, and the record read from it; the first
    precision finishes, the second is still running when the journal ends (interrupted)."""
    rng = random.Random(21)
    path = tmp_path_factory.mktemp("columns") / "long.jsonl"
    writer = JournalWriter(path)
    t = 1_800_000_000.0
    writer.write(RunStarted("long", {"model": "tiny", "precisions": list(PRECISIONS),
                                     "batch_size": 2, "seq_len": 8}, {}, t))
    steps: dict[str, list[StepSample]] = {}
    polls: list[MonitorSample] = []
    for n, precision in enumerate(PRECISIONS):
        writer.write(TrialStarted(precision, n, len(PRECISIONS), t))
        written = []
        for i in range(STEPS):
            for _ in range(3):
                t += 0.05
                polls.append(_poll(rng, round(t, 3), len(polls)))
                writer.write(polls[-1])
            t += 0.05
            step = _step(rng, precision, i, t)
            writer.write(step)
            written.append(step)
            if step.optimizer_ms is not None:  # read back as the float the field holds
                step = dataclasses.replace(step, optimizer_ms=float(step.optimizer_ms))
            steps.setdefault(precision, []).append(step)
        if n == 0:
            writer.write(TrialFinished(TrialResult(precision=precision, status="ok",
                                                   steps=written), t))
    writer.close()
    return read_journal(path), steps, polls


def test_a_long_journal_reads_back_every_step_and_poll_field_by_field(long_journal):
    record, steps, polls = long_journal
    assert record.status == "interrupted"
    for precision in PRECISIONS:
        back = record.steps(precision)
        assert len(back) == STEPS
        assert all(_same(a, b) for a, b in zip(back, steps[precision], strict=True))
        assert _same(back[-1], steps[precision][-1])
    finished, running = (record.trial(p) for p in PRECISIONS)
    assert finished.status == "ok" and len(finished.steps) == STEPS
    assert running.status == "cancelled" and len(running.steps) == STEPS
    assert f"({sum(not s.warmup for s in steps['bf16'])} measured steps journaled)" \
        in running.reason
    assert len(record.monitor_samples) == len(polls)
    assert all(_same(a, b) for a, b in zip(record.monitor_samples, polls, strict=True))


def test_a_read_journals_steps_serialise_as_the_written_ones(long_journal):
    record, steps, _ = long_journal
    written = [dataclasses.asdict(s) for s in steps["fp16-amp"]]
    serialised = record.to_dict()["trials"][0]["steps"]
    assert len(serialised) == STEPS
    assert all(_same(StepSample(**a), StepSample(**b)) for a, b in zip(serialised, written))


def _thin_by_hand(samples: list[MonitorSample], ends: list[float]) -> list[MonitorSample]:
    """The report's rule, one window at a time: per source and per span between two step
    ends, the last poll, the polls holding each field's minimum (the earliest of equal
    ones) and maximum (the latest of equal ones), and any poll carrying GPM's reason."""
    ends = sorted(ends)
    windows: dict[tuple, list[int]] = {}
    for i, s in enumerate(samples):
        span = bisect.bisect_left(ends, s.time_s)  # the step ends before this poll
        windows.setdefault((s.source, span), []).append(i)
    keep = set()
    numeric = [f.name for f in dataclasses.fields(MonitorSample)
               if f.name != "time_s" and f.type in ("float | None", "int | None")]
    for rows in windows.values():
        keep.add(rows[-1])
        keep.update(i for i in rows if samples[i].gpm_reason is not None)
        for name in numeric:
            known = [i for i in rows if getattr(samples[i], name) is not None]
            if known:
                low = min(getattr(samples[i], name) for i in known)
                high = max(getattr(samples[i], name) for i in known)
                keep.add(next(i for i in known if getattr(samples[i], name) == low))
                keep.add([i for i in known if getattr(samples[i], name) == high][-1])
    return [samples[i] for i in sorted(keep, key=lambda i: (samples[i].time_s, i))]


def test_a_reports_thinning_of_the_columns_keeps_what_the_rule_names(long_journal):
    record, steps, polls = long_journal
    ends = [s.time_s for p in PRECISIONS for s in steps[p]]
    expected = _thin_by_hand(polls, ends)
    thinned = for_report(record).monitor_samples
    assert 0 < len(thinned) < len(polls)
    assert all(_same(a, b) for a, b in zip(thinned, expected, strict=True))
    # the same rule on a live run's list of polls
    assert all(_same(a, b) for a, b in zip(thin_samples(polls[:600], ends), _thin_by_hand(
        polls[:600], ends), strict=True))
