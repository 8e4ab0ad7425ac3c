import multiprocessing
import os
import signal

import pytest

import engine.trial as trial_mod
from engine.config import RunConfig
from engine.events import (
    ErrorEvent,
    MonitorSample,
    RunFinished,
    RunStarted,
    StepSample,
    TrialFinished,
    TrialStarted,
)
from engine.record import RunRecord
from engine.runner import Runner


def _config(**kw):
    base = dict(model="tiny", precisions=("fp32", "bf16"), batch_size=1, seq_len=16, steps=2,
                warmup=0, device="cpu", isolation="inline")
    base.update(kw)
    return RunConfig(**base)


def test_inline_run_emits_events_in_order_and_fills_the_record():
    events = []
    record = Runner(_config(), events.append).run()
    kinds = [type(e) for e in events if not isinstance(e, MonitorSample)]
    assert kinds[0] is RunStarted and kinds[-1] is RunFinished
    assert kinds.count(TrialStarted) == 2 and kinds.count(TrialFinished) == 2
    assert any(isinstance(e, MonitorSample) and e.source == "host" for e in events)
    assert [t.status for t in record.trials] == ["ok", "ok"]
    assert record.environment["libraries"]["torch"].startswith("2.13")
    back = RunRecord.from_dict(record.to_dict())
    assert back.trials == record.trials
    assert back.monitor_samples == record.monitor_samples


def test_bad_input_is_an_error_event_then_value_error():
    events = []
    runner = Runner(_config(seq_len=100_000), events.append)
    with pytest.raises(ValueError, match="--seq-len 512"):
        runner.run()
    assert [type(e) for e in events] == [ErrorEvent]
    assert runner.record.status == "error" and "--seq-len" in runner.record.logs[0].message


def test_a_failing_trial_does_not_stop_the_run(monkeypatch):
    real = trial_mod.load_model

    def flaky(model, recipe, *a, **k):
        if recipe.precision == "fp32":
            raise RuntimeError("driver fell over")
        return real(model, recipe, *a, **k)

    monkeypatch.setattr(trial_mod, "load_model", flaky)
    record = Runner(_config()).run()
    assert [(t.precision, t.status) for t in record.trials] == [("fp32", "error"), ("bf16", "ok")]
    assert record.status == "ok"


def test_cancel_mid_run_keeps_measured_steps_and_marks_the_rest():
    runner = None

    def on_event(event):
        if isinstance(event, StepSample):
            runner.cancel()

    runner = Runner(_config(steps=20), on_event)
    record = runner.run()
    first, second = record.trials
    assert first.status == "cancelled" and len(first.steps) >= 1
    assert second.status == "cancelled" and "before this trial started" in second.reason
    assert record.status == "cancelled"


def test_child_process_trial_and_a_killed_child_ends_only_its_trial():
    """Process isolation: SIGKILL (the OOM killer's signal, among others) ends one trial."""
    killed = []

    def on_event(event):
        if isinstance(event, StepSample) and event.precision == "fp32" and not killed:
            child = multiprocessing.active_children()[0]
            killed.append(child.pid)
            os.kill(child.pid, signal.SIGKILL)

    record = Runner(_config(isolation="process", steps=200), on_event).run()
    fp32, bf16 = record.trials
    assert killed
    assert fp32.status == "error" and "killed (SIGKILL)" in fp32.reason and fp32.steps
    assert "out-of-memory killer is one possibility" in fp32.reason
    assert fp32.summary.steps_measured == len(fp32.steps)
    assert bf16.status == "ok" and len(bf16.steps) == 200
