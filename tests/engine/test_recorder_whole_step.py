"""A hand-written loop's step timed whole (issue #45): every micro-batch's data fetch under
gradient accumulation (nanoGPT fetches between forward and backward, an accelerate loop at
the top of each micro-batch), and the constructor form's step 0 recorded like the with
form's."""

import time

import pytest
import torch

import ampscope
from engine.record.journal import read_journal
from tests.engine.test_recorder import padded_batch, tiny_gpt2, tiny_llama

SLEEP_S = 0.02  # the loop's own time per micro-batch fetch
STEPS = 5
MICRO = 3


def fetch(i):
    time.sleep(SLEEP_S)
    return padded_batch(i)


def parts(s):
    return [s.data_ms, s.forward_ms, s.backward_ms, s.optimizer_ms, s.eval_ms or 0.0,
            s.save_ms or 0.0]


def nanogpt_loop(model, opt, sched, rec, seen):
    """nanoGPT's train.py, condensed: the next batch is fetched after each micro-step's
    forward, before its backward; the norm clipped, the lr set, the optimizer step."""
    batch = fetch(0)
    for it in range(STEPS):
        for g in opt.param_groups:
            g["lr"] = 1e-2 * (it + 1) / STEPS  # nanoGPT's get_lr(), set by hand
        tokens = 0
        for micro in range(MICRO):
            tokens += int(batch["attention_mask"].sum())
            loss = model(**batch).loss / MICRO
            batch = fetch(it * MICRO + micro + 1)
            loss.backward()
        seen["grad_norm"].append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
        seen["lr"].append(opt.param_groups[0]["lr"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        seen["loss"].append(float(loss.detach()) * MICRO)
        seen["tokens"].append(tokens)
        rec.step(loss=loss * MICRO)


def accelerate_loop(model, opt, sched, rec, seen):
    """run_clm_no_trainer.py's shape: each micro-batch fetched at the top of the loop,
    the scheduler stepped before the Recorder (its get_last_lr() is the next step's)."""
    for it in range(STEPS):
        tokens, total = 0, 0.0
        for micro in range(MICRO):
            batch = fetch(it * MICRO + micro)
            tokens += int(batch["attention_mask"].sum())
            loss = model(**batch).loss
            total += float(loss.detach()) / MICRO
            (loss / MICRO).backward()
        seen["grad_norm"].append(float(torch.linalg.vector_norm(torch.stack(
            [p.grad.norm() for p in model.parameters() if p.grad is not None]))))
        seen["lr"].append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
        opt.zero_grad()
        seen["loss"].append(total)
        seen["tokens"].append(tokens)
        rec.step(loss=total, lr=sched.get_last_lr())


@pytest.mark.parametrize("loop", [nanogpt_loop, accelerate_loop])
@pytest.mark.parametrize("build", [tiny_gpt2, tiny_llama])
def test_every_micro_batchs_fetch_is_data(tmp_path, build, loop):
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    seen = {"grad_norm": [], "lr": [], "loss": [], "tokens": []}
    with ampscope.Recorder(model, opt, journal=tmp_path / "ga.jsonl") as rec:
        loop(model, opt, sched, rec, seen)
    steps = read_journal(tmp_path / "ga.jsonl").trials[0].steps
    assert len(steps) == STEPS
    # every figure as the loop itself saw it (the micro-batches' tokens summed)
    assert [s.loss for s in steps] == pytest.approx(seen["loss"], rel=1e-6)
    assert [s.learning_rate for s in steps] == pytest.approx(seen["lr"])
    assert [s.grad_norm for s in steps] == pytest.approx(seen["grad_norm"], rel=1e-4)
    assert [s.tokens for s in steps] == seen["tokens"]
    for s in steps[1:]:  # nanoGPT's step 0 fetched its first batch before the Recorder
        assert s.data_ms >= MICRO * SLEEP_S * 1e3  # every micro-batch's sleep, no less
        assert s.backward_ms > 0 and s.forward_ms > 0
        assert sum(parts(s)) == pytest.approx(s.step_ms, rel=1e-6)
        # the backwards themselves are not data: their time is what is left
        assert s.backward_ms < s.step_ms - MICRO * SLEEP_S * 1e3


@pytest.mark.parametrize("build", [tiny_gpt2, tiny_llama])
def test_the_constructor_form_records_step_0_like_the_with_form(tmp_path, build):
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    rec = ampscope.Recorder(model, opt, journal=tmp_path / "c.jsonl")
    began = time.perf_counter()
    used_lr, norms, tokens, first_step_s = [], [], [], None
    for i in range(3):
        batch = fetch(i)
        loss = model(**batch).loss
        loss.backward()
        norms.append(float(torch.linalg.vector_norm(torch.stack(
            [p.grad.norm() for p in model.parameters() if p.grad is not None]))))
        used_lr.append(opt.param_groups[0]["lr"])
        tokens.append(int(batch["attention_mask"].sum()))
        opt.step()
        sched.step()
        opt.zero_grad()
        first_step_s = first_step_s or time.perf_counter()
        rec.step(loss=loss)
    rec.finish()
    (trial,) = read_journal(tmp_path / "c.jsonl").trials
    steps = trial.steps
    assert trial.status == "ok" and len(steps) == 3
    assert [s.learning_rate for s in steps] == pytest.approx(used_lr)
    assert [s.grad_norm for s in steps] == pytest.approx(norms, rel=1e-4)
    assert [s.tokens for s in steps] == tokens
    # step 0 runs from the Recorder's making, as the with form's from the with
    assert steps[0].step_ms >= (first_step_s - began) * 1e3
    assert steps[0].data_ms >= SLEEP_S * 1e3
    assert sum(parts(steps[0])) == pytest.approx(steps[0].step_ms, rel=1e-6)
