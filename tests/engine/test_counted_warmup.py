"""An eager trial counts its FLOPs in its first warm-up step (engine/run/trial_flops.py,
counted_step) instead of an uncounted forward+backward of their own: FlopCounterMode is
active for that step's optimizer step and for no other, and the count equals that of a
separate forward+backward per micro-batch (the probe it replaces; engine.measure.flops's
counting is checked against formulas in test_flops.py), on GPT-2 and Llama, in fp32 and
under bf16 autocast, with and without gradient accumulation."""

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from transformers import AutoModelForCausalLM

from engine.core.config import RunConfig
from engine.measure.flops import count_flops, counting_mode
from engine.run.runner import Runner
from tests.engine.families import causal_lm_folder

COUNTER = type(counting_mode()[0])  # FlopCounterMode as the trials run it

BATCH, SEQ = 2, 16


def _separate_count(folder: str, precision: str):
    """The FLOPs of one forward+backward of a batch of the run's shape, counted apart."""
    model = AutoModelForCausalLM.from_pretrained(folder)
    ids = torch.randint(0, model.config.vocab_size, (BATCH, SEQ))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-amp")

    def step():
        with autocast:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()

    return count_flops(step)


@pytest.mark.parametrize("family", ["gpt2", "llama-gqa"])
@pytest.mark.parametrize("accum", [1, 2])
def test_the_first_warmup_step_is_the_one_counted(family, accum, tmp_path, monkeypatch):
    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path / "data"))
    folder = causal_lm_folder(family, str(tmp_path / family))
    active, steps = [], []
    own_enter, own_exit = COUNTER.__enter__, COUNTER.__exit__

    def enter(self):
        active.append(self)
        return own_enter(self)

    def leave(self, *exc):
        active.remove(self)
        return own_exit(self, *exc)

    monkeypatch.setattr(COUNTER, "__enter__", enter)
    monkeypatch.setattr(COUNTER, "__exit__", leave)
    # every optimizer step of the run, and whether FLOPs were being counted through it
    handle = register_optimizer_step_post_hook(lambda opt, args, kw: steps.append(bool(active)))
    try:
        record = Runner(RunConfig(
            model=folder, precisions=("fp32", "bf16-amp"), batch_size=BATCH, seq_len=SEQ,
            steps=2, warmup=2, grad_accum=accum, device="cpu", isolation="inline",
            interleave="off", profile_step=False, quant_error=False)).run()
    finally:
        handle.remove()
    per_trial = len(steps) // 2
    assert per_trial >= 2 + 2 + 1  # warm-up, measured, the memory step
    for i, p in enumerate(("fp32", "bf16-amp")):
        trial = record.trial(p)
        assert trial.status == "ok", trial.reason
        counted = steps[i * per_trial:(i + 1) * per_trial]
        assert counted == [True] + [False] * (per_trial - 1)  # the first warm-up step only
        assert "first warm-up step" in trial.flops.counted_method
        apart = _separate_count(folder, p)
        assert trial.flops.counted_per_step == accum * apart.total
        assert trial.flops.by_peak_dtype == {k: accum * v for k, v in apart.by_peak_dtype.items()}
        assert sum(trial.flops.by_peak_dtype.values()) == accum * apart.total
        # the steps' rates divide the same counts by their own times
        for s in trial.steps:
            assert s.tflops == pytest.approx(trial.flops.analytic_per_step / (s.step_ms / 1e3)
                                             / 1e12)


def test_a_step_that_compiles_is_counted_apart(tmp_path, monkeypatch):
    """torchao's low-bit AdamW compiles its step, which dynamo does not trace under
    FlopCounterMode: that trial counts a forward+backward of its own first, and trains."""
    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path / "data"))
    folder = causal_lm_folder("gpt2", str(tmp_path / "gpt2"))
    precision = "bf16-amp+adamw8bit-ao"
    record = Runner(RunConfig(
        model=folder, precisions=(precision,), batch_size=BATCH, seq_len=SEQ, steps=1,
        warmup=1, device="cpu", isolation="inline", interleave="off", profile_step=False,
        quant_error=False)).run()
    trial = record.trial(precision)
    assert trial.status == "ok", trial.reason
    assert "one forward+backward" in trial.flops.counted_method
    assert trial.flops.counted_per_step == _separate_count(folder, "bf16-amp").total
