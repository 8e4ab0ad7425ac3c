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


def nanogpt_loop(model, opt, rec):
    """nanoGPT's train.py, condensed: the next batch is fetched after each micro-step's
    forward, before its backward; the norm clipped, then the optimizer step."""
    batch = fetch(0)
    for it in range(STEPS):
        for micro in range(MICRO):
            loss = model(**batch).loss / MICRO
            batch = fetch(it * MICRO + micro + 1)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        rec.step(loss=loss * MICRO)


def accelerate_loop(model, opt, rec):
    """run_clm_no_trainer.py's shape: each micro-batch fetched at the top of the loop."""
    for it in range(STEPS):
        for micro in range(MICRO):
            batch = fetch(it * MICRO + micro)
            loss = model(**batch).loss
            (loss / MICRO).backward()
        opt.step()
        opt.zero_grad()
        rec.step(loss=loss)


@pytest.mark.parametrize("loop", [nanogpt_loop, accelerate_loop])
@pytest.mark.parametrize("build", [tiny_gpt2, tiny_llama])
def test_every_micro_batchs_fetch_is_data(tmp_path, build, loop):
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with ampscope.Recorder(model, opt, journal=tmp_path / "ga.jsonl") as rec:
        loop(model, opt, rec)
    steps = read_journal(tmp_path / "ga.jsonl").trials[0].steps
    assert len(steps) == STEPS
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
