"""The Recorder never drops steps silently (issue #32): real loops passing what users pass.

``lr=sched.get_last_lr()`` (one lr per parameter group), ``tokens=`` as a ``torch.Size``,
a string, NaN or a 2-element tensor, ``lr``/``grad_norm`` as 2-element tensors: every step
is recorded, what cannot be meant is refused with one warning naming the argument, and a
run with no step is not "ok". A ``clip_grad_norm_`` imported by name before the Recorder
starts still gives the pre-clipping norm. An evaluation inside the loop is its own phase.
"""

import subprocess
import sys
import time
import warnings

import pytest
import torch
from torch.nn.utils import clip_grad_norm_  # bound by name before any Recorder starts

import ampscope
from engine.record.journal import read_journal
from tests.engine.test_recorder import padded_batch, tiny_gpt2
from tests.engine.test_trainer_callback import ROOT

STEPS = 4


def _two_group_optimizer(model):
    params = list(model.parameters())
    return torch.optim.AdamW([{"params": params[:2], "lr": 1e-3},
                              {"params": params[2:], "lr": 3e-4}])


@pytest.mark.parametrize("order", ["scheduler first", "rec.step first"])
def test_get_last_lr_list_records_the_lr_every_group_used_in_either_order(tmp_path, order):
    """sched.get_last_lr() after sched.step() is the next step's lr (as in
    run_clm_no_trainer.py): the lr each group's optimizer step used is recorded anyway."""
    model = tiny_gpt2()
    opt = _two_group_optimizer(model)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, [lambda i: 0.5**i, lambda i: 0.9**i])
    used = []
    with ampscope.Recorder(model, opt, out=tmp_path / "lr.json",
                           journal=tmp_path / "lr.jsonl") as rec:
        for i in range(STEPS):
            loss = model(**padded_batch(i)).loss
            loss.backward()
            used.append([g["lr"] for g in opt.param_groups])
            opt.step()
            if order == "rec.step first":
                rec.step(loss=loss, lr=sched.get_last_lr())
            sched.step()
            opt.zero_grad()
            if order == "scheduler first":
                rec.step(loss=loss, lr=sched.get_last_lr())
    record = read_journal(tmp_path / "lr.jsonl")
    (trial,) = record.trials
    assert trial.status == "ok" and len(trial.steps) == STEPS
    assert [s.learning_rate for s in trial.steps] == pytest.approx([u[0] for u in used])
    group1 = [x for x in record.scalars if x.name == "lr_group1"]
    assert [x.step for x in group1] == list(range(STEPS))
    assert [x.value for x in group1] == pytest.approx([u[1] for u in used])
    assert used[0][0] != used[0][1]  # the groups' lrs differ: both are needed
    late = [n for n in trial.notes if "the lr= passed differed" in n]
    assert late == ([f"lr: the lr each optimizer step used (read at the step); the lr= passed "
                     f"differed on {STEPS} steps (sched.get_last_lr() after sched.step() is "
                     "the next step's lr)"] if order == "scheduler first" else [])


def test_optimizer_lr_of_every_group_is_recorded_when_none_is_passed(tmp_path):
    model = tiny_gpt2()
    opt = _two_group_optimizer(model)
    used = []
    with ampscope.Recorder(model, opt, journal=tmp_path / "g.jsonl") as rec:
        for i in range(STEPS):
            model(**padded_batch(i)).loss.backward()
            used.append([g["lr"] for g in opt.param_groups])
            opt.step()
            for g in opt.param_groups:
                g["lr"] *= 0.5
            opt.zero_grad()
            rec.step()
    record = read_journal(tmp_path / "g.jsonl")
    assert [s.learning_rate for s in record.trials[0].steps] == pytest.approx(
        [u[0] for u in used])
    assert [x.value for x in record.scalars if x.name == "lr_group1"] == pytest.approx(
        [u[1] for u in used])


def _loop(tmp_path, name, **step_kwargs):
    """A plain loop passing ``step_kwargs`` (callables of the batch) at every step; the
    warnings it raised and the journal's record."""
    model = tiny_gpt2()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    batches = [padded_batch(i) for i in range(STEPS)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ampscope.Recorder(model, opt, journal=tmp_path / f"{name}.jsonl") as rec:
            for batch in batches:
                loss = model(**batch).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
                rec.step(loss=loss, **{k: f(batch) for k, f in step_kwargs.items()})
    ours = [str(w.message) for w in caught if str(w.message).startswith("ampscope")]
    return read_journal(tmp_path / f"{name}.jsonl"), batches, ours


@pytest.mark.parametrize("make, expected", [
    (lambda b: b["input_ids"].shape, lambda b: b["input_ids"].numel()),
    (lambda b: str(int(b["attention_mask"].sum())), lambda b: int(b["attention_mask"].sum())),
    (lambda b: float(b["attention_mask"].sum()), lambda b: int(b["attention_mask"].sum())),
    (lambda b: b["attention_mask"].sum(), lambda b: int(b["attention_mask"].sum())),
], ids=["torch.Size", "str", "whole float", "mask sum tensor"])
def test_tokens_as_users_pass_them_are_counted(tmp_path, make, expected):
    record, batches, warned = _loop(tmp_path, "tok", tokens=make)
    (trial,) = record.trials
    assert warned == [] and trial.status == "ok"
    assert [s.tokens for s in trial.steps] == [expected(b) for b in batches]


@pytest.mark.parametrize("argument, make", [
    ("tokens", lambda b: float("nan")),
    ("tokens", lambda b: torch.tensor([8, 8])),
    ("tokens", lambda b: "sixteen"),
    ("lr", lambda b: torch.tensor([1e-3, 1e-3])),
    ("lr", lambda b: "fast"),
    ("grad_norm", lambda b: torch.tensor([1.0, 2.0])),
], ids=["tokens nan", "tokens 2 elements", "tokens text", "lr 2 elements", "lr text",
        "grad_norm 2 elements"])
def test_what_cannot_be_meant_is_refused_once_and_every_step_is_kept(tmp_path, argument, make):
    record, batches, warned = _loop(tmp_path, "bad", **{argument: make})
    (trial,) = record.trials
    assert len(warned) == 1 and f"rec.step({argument}=...)" in warned[0], warned
    assert trial.status == "ok" and len(trial.steps) == STEPS
    steps = trial.steps
    if argument == "tokens":  # what the model's forwards saw instead: the real tokens
        assert [s.tokens for s in steps] == [int(b["attention_mask"].sum()) for b in batches]
    if argument == "lr":  # the optimizer's own
        assert [s.learning_rate for s in steps] == pytest.approx([1e-2] * STEPS)
    if argument == "grad_norm":  # measured by AmpScope instead
        assert all(s.grad_norm is not None and s.grad_norm > 0 for s in steps)


def test_a_run_that_recorded_no_step_is_not_ok(tmp_path):
    model = tiny_gpt2()
    with ampscope.Recorder(model, journal=tmp_path / "none.jsonl"):
        model(**padded_batch(0)).loss.backward()
    record = read_journal(tmp_path / "none.jsonl")
    (trial,) = record.trials
    assert record.status == "error" and trial.status == "error"
    assert "no step was recorded" in trial.reason
    out = tmp_path / "none.html"
    proc = subprocess.run([sys.executable, "main.py", "report", str(tmp_path / "none.jsonl"),
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_clip_grad_norm_imported_by_name_still_gives_the_pre_clipping_norm(tmp_path):
    model = tiny_gpt2()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    returned = []
    with ampscope.Recorder(model, opt, journal=tmp_path / "clip.jsonl") as rec:
        for i in range(STEPS):
            loss = model(**padded_batch(i)).loss
            loss.backward()
            returned.append(float(clip_grad_norm_(model.parameters(), 0.5)))
            opt.step()
            opt.zero_grad()
            rec.step(loss=loss)
    (trial,) = read_journal(tmp_path / "clip.jsonl").trials
    assert all(n > 0.5 for n in returned)  # every step clipped: the clipped norm is 0.5
    assert [s.grad_norm for s in trial.steps] == pytest.approx(returned, rel=1e-6)
    assert any("clip_grad_norm_'s own result" in n for n in trial.notes)


def test_an_evaluation_inside_the_loop_is_its_own_phase_not_data_waiting(tmp_path):
    """nanoGPT evaluates at the start of an iteration (model.eval(), no_grad forwards,
    its batches made between them, model.train()) before the training forward."""
    model = tiny_gpt2()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    evaluated_at, eval_forwards_s, eval_block_s = 2, [], None
    with ampscope.Recorder(model, opt, journal=tmp_path / "ev.jsonl") as rec:
        for i in range(STEPS + 1):
            if i == evaluated_at:
                block = time.perf_counter()
                model.eval()
                with torch.no_grad():
                    for k in range(3):
                        batch = padded_batch(10 + k)
                        time.sleep(0.02)  # the evaluation's own batch loading
                        start = time.perf_counter()
                        model(**batch)
                        eval_forwards_s.append(time.perf_counter() - start)
                model.train()
                eval_block_s = time.perf_counter() - block
            loss = model(**padded_batch(i)).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            rec.step(loss=loss)
    (trial,) = read_journal(tmp_path / "ev.jsonl").trials
    step = trial.steps[evaluated_at]
    # the forwards and the batch loading between them: inside the block the test timed
    assert sum(eval_forwards_s) * 1e3 + 2 * 20 <= step.eval_ms <= eval_block_s * 1e3
    parts = [step.data_ms, step.forward_ms, step.backward_ms, step.optimizer_ms, step.eval_ms]
    assert sum(parts) == pytest.approx(step.step_ms, rel=1e-6)
    assert all(s.eval_ms is None for s in trial.steps if s.step != evaluated_at)
    assert any("evaluation inside the loop" in n and "in 1 step" in n for n in trial.notes)
