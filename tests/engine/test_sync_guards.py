"""Host syncs per measured step in the measuring loops, counted by ``sync_guard``.

A timed step must queue its work without waiting for the device (no sync inside it),
and its figures are read while the next step runs: after step k stops, only step k-1's
values come back. The single-process trial runs inline; the distributed rank loop runs
in this process as rank 0 of a one-rank gloo group.

SGD: AdamW's unfused CPU path reads its per-parameter step counters with ``.item()``;
those counters are host tensors on a GPU too, and the fused optimizer used on CUDA has
none (the fused decision is tested in test_distributed.py).
"""

import json
import math

import pytest
import torch

from engine.core.config import RunConfig
from engine.core.events import StepSample
from engine.distributed import rank_main
from engine.distributed.comm import CommCounter
from engine.distributed.recipes import dist_recipe
from engine.measure.device import probe
from engine.measure.trackers import StepTimer
from engine.run.trial import run_trial

SMALL = dict(model="tiny", batch_size=2, seq_len=16, steps=3, warmup=1, device="cpu",
             optimizer="sgd")


def _check_lag_by_one(steps, read_values) -> None:
    """No sync inside any step; nothing read after the first step; after step k stops,
    exactly step k-1's scalars are read and that step emitted."""
    assert len(steps) == len(read_values)
    for k, step in enumerate(steps):
        assert step.inside == [], f"step {k}: {step.inside}"
    first = steps[0]
    assert first.syncs_after() == [] and first.marks_after("emit") == []
    for k in range(1, len(steps)):
        after = steps[k]
        emitted = [e.value for e in after.marks_after("emit")]
        assert [s["step"] for s in emitted][:1] == [k - 1]
        # the reads of step k-1 come before its emit, and nothing else is read before it
        reads = []
        for entry in after.after:
            if entry.kind == "mark" and entry.name == "emit":
                break
            reads.append(entry)
        assert all(e.kind == "sync" and e.name == "item" for e in reads), reads
        assert sorted(e.value for e in reads) == pytest.approx(sorted(read_values[k - 1]))


@pytest.mark.parametrize("precision", ["fp32", "bf16-amp"])
def test_the_trial_reads_each_step_one_step_late(precision, sync_guard):
    sync_guard.mark_calls(StepTimer, "start", "start")
    sync_guard.mark_calls(StepTimer, "stop", "stop")

    def emit(event):
        if isinstance(event, StepSample):
            sync_guard.mark("emit", {"step": event.step, "loss": event.loss,
                                     "grad_norm": event.grad_norm})

    config = RunConfig(**SMALL, isolation="inline", profile_step=False)
    result = run_trial(config, precision, probe("cpu"), emit, lambda: False)
    assert result.status == "ok", result.reason
    # what the readback holds for a step without a GradScaler: its loss and its norm
    values = [[s.loss, s.grad_norm] for s in result.steps]
    steps = sync_guard.steps()
    assert len(steps) == config.warmup + config.steps
    _check_lag_by_one(steps, values)


@pytest.mark.parametrize(("strategy", "precision"), [("ddp", "fp32"), ("fsdp2", "bf16-amp"),
                                                   ("fsdp2", "fp8-fsdp-ag")])
def test_the_rank_loop_reads_each_step_one_step_late(strategy, precision, sync_guard,
                                                     one_rank_group, tmp_path):
    sync_guard.mark_calls(StepTimer, "start", "start")
    sync_guard.mark_calls(StepTimer, "stop", "stop")
    write = rank_main._Journal.write

    def journal_write(self, kind, data):
        if kind == "step":
            sync_guard.mark("emit", data)
        write(self, kind, data)

    sync_guard._monkeypatch.setattr(rank_main._Journal, "write", journal_write)
    # Python code on every op (the collective counter, the saved-tensor and unshard hooks)
    # belongs to the untimed counting step only: a call inside a timed step fails below
    watched = [(CommCounter, "__torch_dispatch__"), (rank_main._Activations, "pack"),
               (rank_main._Unsharded, "_sample")]
    for owner, attr in watched:
        sync_guard.mark_calls(owner, attr, attr)
    config = RunConfig(**SMALL, strategy=strategy)
    journal = rank_main._Journal(tmp_path / "rank0.jsonl")
    rank_main._train(config, dist_recipe(precision, strategy), torch.device("cpu"), 0, 1,
                     journal)
    lines = [json.loads(x) for x in (tmp_path / "rank0.jsonl").read_text().splitlines()]
    written = [x for x in lines if x["type"] == "step"]
    result = next(x for x in lines if x["type"] == "result")
    # the readback holds a step's loss and norm; under FSDP2 a rank writes no norm (its
    # shards' only): with one rank, the global norm is the root of its own squared
    norms = [s["grad_norm"] if s["grad_norm"] is not None else result["global_grad_norm"][k]
             for k, s in enumerate(written)]
    values = [[s["loss"], norm] for s, norm in zip(written, norms)]
    assert all(math.isfinite(v) for row in values for v in row)
    steps = sync_guard.steps()
    assert len(steps) == config.warmup + config.steps
    _check_lag_by_one(steps, values)
    assert result["global_loss"] == pytest.approx([s["loss"] for s in written])
    first_start = next(i for i, e in enumerate(sync_guard.log) if e.name == "start")
    counted = {e.name for e in sync_guard.log[:first_start] if e.kind == "mark"}
    assert {"__torch_dispatch__", "pack"} <= counted
    assert ("_sample" in counted) == (strategy == "fsdp2")
    # the loss and norm of every step cross the ranks once, after the last step
    tail = steps[-1].after
    last_emit = max(i for i, e in enumerate(tail) if e.kind == "mark" and e.name == "emit")
    assert [e.name for e in tail[last_emit:] if e.kind == "sync"].count("tolist") == 1
