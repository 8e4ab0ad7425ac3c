"""The engine says which phase each trial is in, as it changes, and journals it."""

import json

import pytest

from engine.core.config import RunConfig
from engine.core.events import PhaseChanged, StepSample, TrialFinished, TrialStarted
from engine.run.runner import Runner

TINY = dict(model="tiny", batch_size=1, seq_len=16, device="cpu", isolation="inline")


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path))
    return tmp_path


def _run(config: RunConfig) -> tuple[list, Runner]:
    events: list = []
    runner = Runner(config, events.append)
    runner.run()
    return events, runner


def _phases(events, precision=None, round_=None) -> list[str]:
    return [e.phase for e in events if isinstance(e, PhaseChanged)
            and precision in (None, e.precision) and round_ in (None, e.round)]


def test_one_trial_goes_through_its_phases_in_order(data_dir):
    events, runner = _run(RunConfig(**TINY, precisions=("fp32",), steps=3, warmup=2))
    assert _phases(events) == ["loading", "probes", "warm-up", "measuring", "memory step",
                               "profiled step"]
    kinds = [e.phase if isinstance(e, PhaseChanged) else type(e).__name__ for e in events
             if isinstance(e, PhaseChanged | StepSample | TrialStarted | TrialFinished)]
    # the model loads after TrialStarted; every step is sent before the untimed steps run
    assert kinds[:2] == ["TrialStarted", "loading"]
    assert kinds.index("warm-up") < kinds.index("StepSample")
    assert kinds.count("StepSample") == 5
    last_step = len(kinds) - 1 - kinds[::-1].index("StepSample")
    assert last_step < kinds.index("memory step") < kinds.index("profiled step")
    assert kinds[-1] == "TrialFinished"
    # the step that starts measuring comes after the phase says so: steps 0, 1 warm up
    steps = [e for e in events if isinstance(e, StepSample | PhaseChanged)]
    measuring = next(i for i, e in enumerate(steps) if getattr(e, "phase", "") == "measuring")
    assert not any(isinstance(s, StepSample) and not s.warmup for s in steps[:measuring])
    # the journal holds the same phases, in the same order
    lines = [json.loads(line) for line in runner.journal_path.read_text().splitlines()]
    assert [line["phase"] for line in lines if line["e"] == "phase"] == _phases(events)


def test_warm_up_even_with_warmup_0_and_no_profiled_step_when_off(data_dir):
    events, _ = _run(RunConfig(**TINY, precisions=("fp32",), steps=2, warmup=0,
                               profile_step=False))
    # a trial's first step is never measured (engine.core.config.MIN_WARMUP)
    assert _phases(events) == ["loading", "probes", "warm-up", "measuring", "memory step"]


def test_interleaved_rounds_say_between_rounds_and_reload(data_dir):
    events, _ = _run(RunConfig(**TINY, precisions=("fp32", "bf16-amp"), steps=4, warmup=1,
                               interleave="on", rounds=2))
    steps = ["loading", "probes", "warm-up", "measuring"]
    for p in ("fp32", "bf16-amp"):
        # the profiled step runs once per recipe, in the first round; the memory step in the
        # last, whose figures the result keeps (tests/engine/test_round_tail.py)
        assert _phases(events, p, 0) == [*steps, "profiled step", "between rounds"]
        assert _phases(events, p, 1) == [*steps, "memory step"]
    # mirrored rounds (ABBA): fp32 waits between rounds while bf16-amp runs both of its own
    order = [(e.precision, e.round, e.phase) for e in events if isinstance(e, PhaseChanged)
             and e.phase in ("loading", "between rounds")]
    assert order == [("fp32", 0, "loading"), ("fp32", 0, "between rounds"),
                     ("bf16-amp", 0, "loading"), ("bf16-amp", 0, "between rounds"),
                     ("bf16-amp", 1, "loading"), ("fp32", 1, "loading")]
    finished = [e.result.precision for e in events if isinstance(e, TrialFinished)]
    assert finished == ["bf16-amp", "fp32"]
