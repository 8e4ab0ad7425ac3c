import dataclasses
import json
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from engine.core.recipes import recipe
from engine.numerics.gradients import activation_stats, gradient_stats, underflow_fraction

CPU = torch.device("cpu")


def _cast_flushes(values: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    nonzero = values[values != 0]
    return ((nonzero.double() * scale).to(dtype) == 0).float().mean()


@pytest.mark.parametrize("scale", [1.0, 2.0**16])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float8_e5m2])
def test_underflow_fraction_agrees_with_casting(scale, dtype):
    values = torch.tensor([1e-12, 1e-9, 2.0**-25, 1e-7, 1e-6, 1e-4, 1e-3, 0.0, -1e-9, -0.5])
    assert underflow_fraction(values, scale, dtype) == pytest.approx(
        _cast_flushes(values, scale, dtype).item())


def test_underflow_fraction_known_case():
    values = torch.tensor([1e-9, 1e-6, 1e-3, 0.0])
    assert underflow_fraction(values, 1.0) == pytest.approx(1 / 3)  # only 1e-9 flushes
    assert underflow_fraction(values, 2.0**16) == 0.0  # 1e-9 * 65536 ~ 6.6e-5 survives


class _Dot(nn.Module):
    """loss = sum(w * c): the gradient of w is exactly c."""

    def __init__(self, n: int):
        super().__init__()
        self.w = nn.Parameter(torch.ones(n))

    def forward(self, c):
        return SimpleNamespace(loss=(self.w * c).sum())


def test_suggested_scales_bound_overflow_and_underflow():
    c = torch.cat([torch.full((20,), 2.0**-30), torch.full((10_000,), 2.0**-10)])
    stats = gradient_stats(_Dot(c.numel()), {"c": c}, recipe("fp32"), 2.0**16, CPU)
    lower, upper = stats.suggested_scale_min, stats.suggested_scale_max
    fp16_max = torch.finfo(torch.float16).max
    assert c.max() * upper <= fp16_max < c.max() * upper * 2
    assert underflow_fraction(c, lower) <= stats.underflow_target
    assert underflow_fraction(c, lower / 2) > stats.underflow_target
    assert stats.overall.nonzero == c.numel()
    assert stats.underflow_scale1["fp16"] == underflow_fraction(c, 1.0)
    assert stats.overflow_ratio_fp16 == pytest.approx(2.0**-10 * 2.0**16 / fp16_max)


@pytest.fixture(scope="module")
def tiny_gpt2():
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=128,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids, "labels": ids}


def test_gradient_stats_of_tiny_gpt2_agree_with_a_plain_backward(tiny_gpt2):
    model, batch = tiny_gpt2
    stats = gradient_stats(model, batch, recipe("fp32"), 2.0**16, CPU)
    assert all(p.grad is None for p in model.parameters())  # left clean
    model(**batch).loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])  # tied weight once
    model.zero_grad(set_to_none=True)
    assert stats.overall.nonzero == int((grads != 0).sum())
    assert stats.overall.max_abs == pytest.approx(grads.abs().max().item())
    assert sum(stats.overall.histogram.counts) == stats.overall.nonzero
    assert sum(g.nonzero for g in stats.groups) == stats.overall.nonzero
    assert stats.underflow_scale1["fp16"] == pytest.approx(underflow_fraction(grads, 1.0))
    assert {"embeddings", "attention", "mlp", "norm"} <= {g.name for g in stats.groups}
    edges = stats.overall.histogram.log2_edges
    assert len(edges) == len(stats.overall.histogram.counts) + 1
    assert edges[0] < math.log2(grads[grads != 0].abs().min().item()) <= edges[1]
    json.dumps(dataclasses.asdict(stats))


def test_fp16_amp_backward_runs_at_the_loss_scale_and_is_unscaled(tiny_gpt2):
    model, batch = tiny_gpt2
    stats = gradient_stats(model, batch, recipe("fp16-amp"), 2.0**10, CPU)
    fp32 = gradient_stats(model, batch, recipe("fp32"), 2.0**10, CPU)
    assert stats.backward_scale == 2.0**10 and fp32.backward_scale == 1.0
    # unscaled: same magnitude as fp32 gradients, not 1024 times larger
    assert stats.overall.max_abs == pytest.approx(fp32.overall.max_abs, rel=0.05)


def test_activation_stats_record_autocast_dtypes(tiny_gpt2):
    model, batch = tiny_gpt2
    stats = {m.name: m for m in activation_stats(model, batch, recipe("bf16-amp"), CPU).modules}
    x = torch.randn(3, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        addmm = torch.addmm(torch.zeros(8), x, torch.randn(64, 8)).dtype
        norm = nn.LayerNorm(64)(x).dtype
    assert stats["Conv1D"].dtypes == (str(addmm),)
    assert stats["LayerNorm"].dtypes == (str(norm),)
    assert stats["Embedding"].dtypes == ("torch.float32",)
    assert all(m.nonzero > 0 for m in stats.values())
