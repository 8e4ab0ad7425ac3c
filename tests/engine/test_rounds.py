"""Interleaved precisions: the mirrored (ABBA) schedule, the cheap rule, and a real run's events."""

import numpy as np
import pytest

from engine.core.config import RunConfig
from engine.core.events import LogEvent, StepSample, TrialFinished, TrialStarted
from engine.record.run_record import RunRecord
from engine.run.rounds import CHEAP_PARAMS, choose_rounds, schedule, split_steps
from engine.run.runner import Runner


def _config(**kw):
    base = dict(model="tiny", precisions=("fp32", "bf16"), batch_size=1, seq_len=16, steps=4,
                warmup=1, device="cpu", isolation="inline")
    base.update(kw)
    return RunConfig(**base)


def test_schedule_mirrors_every_other_round_and_splits_the_steps():
    config = _config(precisions=("fp32", "bf16-amp", "fp16-amp"), steps=11, rounds=3)
    plan = schedule(config, 3)
    assert [(r.precision, r.round) for r in plan] == [
        ("fp32", 0), ("bf16-amp", 0), ("fp16-amp", 0),
        ("fp16-amp", 1), ("bf16-amp", 1), ("fp32", 1),
        ("fp32", 2), ("bf16-amp", 2), ("fp16-amp", 2),
    ]
    assert [r.config.steps for r in plan[::3]] == [4, 4, 3] == split_steps(11, 3)
    assert all(r.config.warmup == 1 for r in plan)  # every fresh round warms up
    assert [r.config for r in schedule(config, 1)] == [config] * 3


@pytest.mark.parametrize("rounds", [2, 4])
def test_a_steady_drift_adds_the_same_time_to_every_precision(rounds):
    # a machine slowing by 1 ms per slot: each precision's mean added delay must be equal
    config = _config(precisions=("fp32", "bf16-amp", "fp16-amp"), steps=4 * rounds,
                     rounds=rounds)
    added: dict[str, list[int]] = {}
    for slot, item in enumerate(schedule(config, rounds)):
        added.setdefault(item.precision, []).append(slot)
    means = {p: sum(v) / len(v) for p, v in added.items()}
    assert len(set(means.values())) == 1, means


@pytest.mark.parametrize(
    ("changes", "params", "rounds", "fragment"),
    [
        ({"steps": 10}, 1_000_000, 2, "cheap"),
        ({"steps": 10}, CHEAP_PARAMS + 1, 1, "--interleave on forces"),
        ({"steps": 9}, 1_000_000, 1, "too few"),  # 2 rounds of at least 5 steps
        ({"steps": 10, "precisions": ("fp32",)}, 1_000_000, 1, "one precision"),
        ({"steps": 10, "interleave": "off"}, 1_000_000, 1, "off"),
        ({"steps": 10, "compile": True}, 1_000_000, 1, "recompile"),
        ({"steps": 4, "interleave": "on"}, CHEAP_PARAMS * 10, 2, "on"),
    ],
)
def test_auto_interleaves_only_cheap_trials(changes, params, rounds, fragment):
    got, why = choose_rounds(_config(**changes), params)
    assert got == rounds and fragment in why


def test_auto_counts_the_model_itself():
    assert choose_rounds(_config(steps=10))[0] == 2  # the tiny preset is far below the limit


def test_bad_interleave_settings_say_how_to_fix_them():
    with pytest.raises(ValueError, match="--interleave"):
        _config(interleave="sometimes")
    with pytest.raises(ValueError, match="--rounds"):
        _config(rounds=1)
    with pytest.raises(ValueError, match="raise --steps"):
        _config(interleave="on", rounds=3, steps=2)


def test_interleaved_run_alternates_rounds_and_combines_their_steps():
    events = []
    config = _config(interleave="on", rounds=2, steps=4, warmup=1)
    record = Runner(config, events.append).run()
    started = [(e.precision, e.round, e.rounds) for e in events if isinstance(e, TrialStarted)]
    assert started == [("fp32", 0, 2), ("bf16", 0, 2), ("bf16", 1, 2), ("fp32", 1, 2)]
    steps = [(e.precision, e.round, e.step, e.warmup) for e in events
             if isinstance(e, StepSample)]
    assert steps == [
        ("fp32", 0, 0, True), ("fp32", 0, 1, False), ("fp32", 0, 2, False),
        ("bf16", 0, 0, True), ("bf16", 0, 1, False), ("bf16", 0, 2, False),
        ("bf16", 1, 3, True), ("bf16", 1, 4, False), ("bf16", 1, 5, False),
        ("fp32", 1, 3, True), ("fp32", 1, 4, False), ("fp32", 1, 5, False),
    ]
    # one finished trial per precision, after its last round, holding every round's steps
    finished = [e.result for e in events if isinstance(e, TrialFinished)]
    assert [t.precision for t in finished] == ["bf16", "fp32"]
    assert [t.precision for t in record.trials] == ["fp32", "bf16"]  # as configured
    assert any(isinstance(e, LogEvent) and "2 rounds" in e.message for e in events)
    for trial in finished:
        assert trial.status == "ok"
        assert [(s.round, s.step) for s in trial.steps] == [(0, 0), (0, 1), (0, 2), (1, 3),
                                                            (1, 4), (1, 5)]
        measured = [s.step_ms for s in trial.steps if not s.warmup]
        assert trial.summary.steps_measured == 4
        assert trial.summary.median_step_ms == pytest.approx(np.median(measured))
        assert trial.summary.spread.rounds == 2
        assert trial.summary.spread.p90_step_ms == pytest.approx(np.percentile(measured, 90))
        assert record.steps(trial.precision) == trial.steps
    back = RunRecord.from_dict(record.to_dict())
    assert back.trials == record.trials


def test_live_record_keeps_earlier_rounds_while_a_later_one_runs():
    record = RunRecord()
    first = StepSample("fp32", 0, False, 1.0, 5.0, 1.0, None, None, None, None, None, False, 1.0,
                       0.0)
    record.apply(TrialStarted("fp32", 0, 4, 0.0))
    record.apply(first)
    record.apply(TrialStarted("fp32", 2, 4, 1.0, round=1, rounds=2))
    assert record.steps("fp32") == [first]


def test_a_failed_round_ends_its_precision_and_keeps_the_earlier_rounds(monkeypatch):
    from engine.run import trial_setup

    real, loads = trial_setup.load_model, []

    def second_fp32_load_fails(model, recipe, *a, **k):
        loads.append(recipe.precision)
        if recipe.precision == "fp32" and loads.count("fp32") == 2:
            raise RuntimeError("driver fell over")
        return real(model, recipe, *a, **k)

    monkeypatch.setattr(trial_setup, "load_model", second_fp32_load_fails)
    events = []
    record = Runner(_config(interleave="on", rounds=2), events.append).run()
    fp32, bf16 = record.trials
    assert fp32.status == "error" and "driver fell over" in fp32.reason
    assert [s.round for s in fp32.steps] == [0, 0, 0]  # round 1 never stepped
    assert bf16.status == "ok" and [s.round for s in bf16.steps] == [0, 0, 0, 1, 1, 1]
    assert [type(e) for e in events].count(TrialFinished) == 2
