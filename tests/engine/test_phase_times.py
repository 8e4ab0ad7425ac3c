"""Where each trial's time went, and the next trial's process started early: a real run of
two trials in their own processes (tiny preset, CPU), read back from the journal."""

import json

import pytest

from engine.core.config import RunConfig
from engine.core.events import LogEvent, PhaseChanged, StepSample, TrialFinished
from engine.record.journal import read_journal
from engine.run.phase_clock import on_path_s
from engine.run.runner import Runner

TINY = dict(model="tiny", batch_size=1, seq_len=16, steps=2, warmup=1, device="cpu")
IN_ORDER = ["spawn", "imports", "build", "probes", "warm-up", "measured", "memory step",
            "profiled step", "teardown"]


@pytest.fixture(scope="module")
def two_trials(tmp_path_factory):
    import os

    old = os.environ.get("AMPSCOPE_DATA_DIR")
    os.environ["AMPSCOPE_DATA_DIR"] = str(tmp_path_factory.mktemp("data"))
    try:
        events: list = []
        runner = Runner(RunConfig(**TINY, precisions=("fp32", "fp16-amp")), events.append)
        record = runner.run()
    finally:
        if old is None:
            os.environ.pop("AMPSCOPE_DATA_DIR")
        else:
            os.environ["AMPSCOPE_DATA_DIR"] = old
    return record, events, runner


def test_each_phase_of_a_trial_is_timed_and_they_add_up_to_its_span(two_trials):
    record, events, _ = two_trials
    for trial in record.trials:
        assert trial.status == "ok", trial.reason
        times, starts = trial.phase_times, trial.phase_starts
        # waits: for the device, and (a process ready before the run drew its weights) them
        assert [p for p in times if p not in ("waiting", "initial weights")] == IN_ORDER
        assert all(s >= 0 for s in times.values())
        # the phases tile the trial's span, from asking for its process to the process gone
        assert sum(times.values()) == pytest.approx(starts["end"] - starts["spawn"], abs=1e-6)
        # the phases' starts are the engine's own PhaseChanged times
        said = {e.phase: e.time_s for e in events
                if isinstance(e, PhaseChanged) and e.precision == trial.precision}
        assert starts["warm-up"] == said["warm-up"] and starts["measured"] == said["measuring"]
        assert starts["memory step"] == said["memory step"]
        # the measured phase holds the measured steps: their times fit inside it
        measured = [s.step_ms for s in trial.steps if not s.warmup]
        assert len(measured) == 2 and sum(measured) / 1e3 <= times["measured"]
        done = next(e for e in events if isinstance(e, TrialFinished)
                    and e.result.precision == trial.precision)
        assert starts["teardown"] == pytest.approx(done.time_s, abs=5.0)


def test_the_next_process_starts_early_but_touches_nothing_before_the_device_is_free(
        two_trials):
    record, events, _ = two_trials
    first, second = record.trials
    assert "waiting" not in first.phase_times and "waiting" in second.phase_times
    # fp16-amp's process was asked for while fp32 ran its untimed memory step, and its own
    # clock marked its imports done before fp32's process was gone
    assert first.phase_starts["memory step"] <= second.phase_starts["spawn"]
    assert second.phase_starts["spawn"] < first.phase_starts["end"]
    assert second.phase_starts["imports"] < first.phase_starts["end"]
    # it was handed its trial, and built its model, only after fp32's process had ended
    assert second.phase_starts["build"] >= first.phase_starts["end"]
    touched = [e.time_s for e in events if getattr(e, "precision", None) == "fp16-amp"
               and isinstance(e, StepSample | PhaseChanged | LogEvent)
               and not (isinstance(e, PhaseChanged) and e.phase == "loading")]
    assert touched and min(touched) >= first.phase_starts["end"]
    # off the critical path: its spawn, imports and wait ran beside fp32
    assert on_path_s(second.phase_times) == pytest.approx(
        second.phase_starts["end"] - second.phase_starts["build"], abs=1e-6)


def test_phase_times_are_in_the_journal_and_the_json_report(two_trials, tmp_path):
    record, _, runner = two_trials
    lines = [json.loads(x) for x in runner.journal_path.read_text().splitlines()]
    done = {x["result"]["precision"]: x["result"] for x in lines if x.get("e") == "done"}
    for trial in record.trials:
        assert done[trial.precision]["phase_times"] == trial.phase_times
    again = read_journal(runner.journal_path)
    assert [t.phase_times for t in again.trials] == [t.phase_times for t in record.trials]
    report = json.loads(json.dumps(record.to_dict()))
    assert report["trials"][1]["phase_starts"]["end"] == record.trials[1].phase_starts["end"]


def test_the_run_weights_folder_is_gone_after_the_run(two_trials):
    _, events, runner = two_trials
    assert any("initial weights drawn once" in e.message for e in events
               if isinstance(e, LogEvent))
    assert not list(runner.journal_path.parent.glob("*.weights.*"))


def test_inline_trials_time_their_phases_too(tmp_path, monkeypatch):
    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path))
    config = RunConfig(**TINY, precisions=("fp32",), isolation="inline", profile_step=False)
    (trial,) = Runner(config).run().trials
    assert list(trial.phase_times) == ["build", "probes", "warm-up", "measured",
                                       "memory step", "teardown"]


@pytest.mark.gpu
def test_on_a_gpu_the_early_process_starts_no_cuda_before_it_is_handed_its_trial(tmp_path,
                                                                                 monkeypatch):
    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path))
    events: list = []
    config = RunConfig(**{**TINY, "device": "cuda"}, precisions=("fp32", "bf16-amp"))
    first, second = Runner(config, events.append).run().trials
    assert "waiting" in second.phase_times
    assert not [e for e in events if isinstance(e, LogEvent) and "started CUDA" in e.message]
    assert second.phase_starts["build"] >= first.phase_starts["end"]
