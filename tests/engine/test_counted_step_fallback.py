"""A FLOP count that fails part-way through the first warm-up step (a quantised kernel
refusing FlopCounterMode) is followed by the same step run plainly (engine/run/trial_flops.py,
counted_step). The failed attempt may have unscaled the gradients: the rerun must equal a
clean step, so the trial's losses, grad norms and loss scales equal those of a trial whose
count succeeded. A failure once the optimizer step has begun (weights may be half updated)
is not rerun on top: the trial ends with that error."""

import pytest
import transformers as tf
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from engine.core.config import RunConfig
from engine.measure import flops as flops_mod
from engine.measure.device import probe
from engine.run.trial import run_trial

CPU = probe("cpu")


def _trial(precision: str, model: str = "tiny", status: str = "ok"):
    config = RunConfig(model=model, batch_size=2, seq_len=16, steps=3, warmup=1, device="cpu",
                       isolation="inline", profile_step=False, quant_error=False)
    result = run_trial(config, precision, CPU, lambda e: None, lambda: False)
    assert result.status == status, result.reason
    return result


def _figures(result):
    return [(s.loss, s.grad_norm, s.loss_scale) for s in result.steps]


def _with_dropout(root) -> str:
    """A GPT-2 whose dropout draws from the random state: a rerun must draw the same masks."""
    config = tf.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=256, n_positions=64,
                           resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    tf.GPT2LMHeadModel(config).save_pretrained(root)
    return str(root)


@pytest.mark.parametrize("where", ["pre", "post"])  # the optimizer step: before it, or after
@pytest.mark.parametrize("precision,dropout", [("fp16-amp", False), ("fp32", False),
                                               ("fp32", True)])
def test_a_count_failing_after_unscale_leaves_no_half_step(precision, dropout, where,
                                                          monkeypatch, tmp_path):
    model = _with_dropout(tmp_path / "gpt2") if dropout else "tiny"
    clean = _trial(precision, model)
    real_count = flops_mod.count_flops
    register = {"pre": register_optimizer_step_pre_hook,
                "post": register_optimizer_step_post_hook}[where]

    def refused(*args, **kwargs):
        raise RuntimeError("this kernel refuses FlopCounterMode")

    def count_then_fail(fn, tf32=False):
        handle = register(refused)
        try:
            return real_count(fn, tf32)
        finally:
            handle.remove()

    monkeypatch.setattr(flops_mod, "count_flops", count_then_fail)
    if where == "post":
        failed = _trial(precision, model, status="error")
        assert "refuses FlopCounterMode" in failed.reason and not failed.steps
        return
    failed = _trial(precision, model)
    assert "FlopCounterMode failed: RuntimeError" in failed.flops.counted_method
    assert _figures(failed) == _figures(clean)
    if precision == "fp16-amp":
        assert failed.steps[0].loss_scale is not None
