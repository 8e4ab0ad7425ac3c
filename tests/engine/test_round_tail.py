"""An interleaved precision's memory step, held-out loss and lost updates run in its last
round only (the combined result keeps that round's): every figure equals that of the same run
with every round running them, as before, on GPT-2 (the tiny preset) and Llama (families.py).
"""

import pytest

from engine.core.config import RunConfig
from engine.core.events import PhaseChanged
from engine.run.runner import Runner
from engine.run.trial import LATER_ROUND
from tests.engine.families import causal_lm_folder

PRECISIONS = ("fp32", "bf16")  # bf16 weights lose updates; fp32's are n/a


def _config(model: str) -> RunConfig:
    return RunConfig(model=model, precisions=PRECISIONS, batch_size=2, seq_len=16, steps=4,
                     warmup=1, device="cpu", isolation="inline", interleave="on", rounds=2)


def _run(config: RunConfig, on_event=None):
    events: list = []

    def emit(event):
        events.append(event)
        if on_event is not None:
            on_event(event)

    runner = Runner(config, emit)
    return runner, runner.run, events


def _every_round(monkeypatch) -> None:
    """The earlier way: every round runs the memory step and the untimed tail."""
    own = Runner._trial_config
    monkeypatch.setattr(Runner, "_trial_config",
                        lambda self, item: own(self, item).replace(last_round=True))


@pytest.mark.parametrize("family", ["tiny", "llama-gqa"])
def test_the_last_rounds_tail_gives_the_figures_every_round_running_it_gave(
        family, tmp_path, monkeypatch):
    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path / "data"))
    model = family if family == "tiny" else causal_lm_folder(family, str(tmp_path / family))
    _, run, events = _run(_config(model))
    now = run()
    watched = sorted((e.precision, e.round) for e in events
                     if isinstance(e, PhaseChanged) and e.phase == "memory step")
    assert watched == sorted((p, 1) for p in PRECISIONS)  # once per precision, its last round
    with monkeypatch.context() as m:
        _every_round(m)
        _, run_before, events_before = _run(_config(model))
        before = run_before()
    watched_before = [(e.precision, e.round) for e in events_before
                      if isinstance(e, PhaseChanged) and e.phase == "memory step"]
    assert sorted(watched_before) == sorted((p, r) for p in PRECISIONS for r in (0, 1))
    for p in PRECISIONS:
        a, b = now.trial(p), before.trial(p)
        assert a.status == b.status == "ok"
        # the steps of both rounds are the same: skipping the first round's held-out forward
        # changed nothing they computed
        assert [(s.round, s.loss, s.grad_norm) for s in a.steps] == [
            (s.round, s.loss, s.grad_norm) for s in b.steps]
        assert a.memory == b.memory and a.memory.total_bytes
        assert a.memory_timeline == b.memory_timeline and a.memory_timeline.points
        assert a.predicted_memory == b.predicted_memory
        assert a.summary.peak_memory_bytes == b.summary.peak_memory_bytes == a.memory.total_bytes
        assert a.summary.peak_memory_method == b.summary.peak_memory_method
        assert a.heldout_loss == b.heldout_loss and a.heldout_loss is not None
        # the held-out loss after counts the last round's steps and its memory step
        assert a.heldout_loss.steps == 1 + 2 + 1  # warm-up, this round's measured, memory step
        assert (a.lost_updates, a.lost_updates_reason) == (b.lost_updates,
                                                           b.lost_updates_reason)
        assert a.quant_error == b.quant_error
        # the first round's profiled step no longer follows a memory step: the same ops with
        # the same dtypes and calls, and the same CPU peak (its times are times)
        ops = [sorted((o.op, o.dtype, o.category, o.calls) for o in t.profiled_step.ops)
               for t in (a, b)]
        assert ops[0] == ops[1] and ops[0]
        assert a.profiled_step.peak_memory_bytes == b.profiled_step.peak_memory_bytes
        assert a.profiled_step.peak_memory_method == b.profiled_step.peak_memory_method
    assert now.trial("bf16").lost_updates is not None
    assert now.trial("bf16").lost_updates.element_share is not None


def test_a_run_stopped_between_rounds_says_why_the_last_rounds_figures_are_missing(
        tmp_path, monkeypatch):
    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path / "data"))

    def stop_after_first_rounds(event):
        # ABBA: fp32, bf16, then bf16's second round: stop once bf16's first is over
        if isinstance(event, PhaseChanged) and (event.precision, event.round, event.phase) == (
                "bf16", 0, "between rounds"):
            runner.cancel()

    runner, run, _ = _run(_config("tiny"), stop_after_first_rounds)
    record = run()
    for p in PRECISIONS:
        trial = record.trial(p)
        assert trial.status == "cancelled"
        assert [s.round for s in trial.steps] == [0, 0, 0]  # the first round's steps are kept
        assert trial.heldout_loss is None and trial.heldout_loss_reason == LATER_ROUND
        assert trial.lost_updates is None and trial.lost_updates_reason == LATER_ROUND
        # what the trial held between steps, never called its peak
        assert trial.memory.params_bytes > 0 and trial.memory.activations_bytes is None
        assert trial.summary.peak_memory_bytes is None
        assert "stopped before the watched step" in trial.summary.peak_memory_method
        assert trial.profiled_step is not None  # the first round's kernel table is kept
