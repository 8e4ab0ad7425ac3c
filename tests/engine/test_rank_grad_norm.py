"""The rank loop's gradient norm is summed in fp32, as the single-process trial's is: a
norm taken in bf16 over bf16 gradients is about 0.5% off. Tested in the rank's own step
function, on one gloo rank in this process, against a norm the test sums in float64."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from engine.core.config import RunConfig
from engine.distributed import rank_main
from engine.distributed.recipes import dist_recipe


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(256, 256, dtype=torch.bfloat16)
        self.b = nn.Linear(256, 256, dtype=torch.bfloat16)

    def forward(self, x):
        return SimpleNamespace(loss=self.b(torch.tanh(self.a(x))).float().pow(2).mean())


def test_the_rank_step_sums_the_gradient_norm_in_fp32(one_rank_group):
    torch.manual_seed(0)
    rec = dist_recipe("bf16", "ddp")
    model = nn.parallel.DistributedDataParallel(_Net())
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=0.0)
    seen = []
    real_step = optimizer.step

    def step(*args, **kwargs):
        seen.extend(p.grad.detach().clone() for p in params)
        return real_step(*args, **kwargs)

    optimizer.step = step
    config = RunConfig(model="tiny", precisions=("bf16",), strategy="ddp", device="cpu")
    batches = [{"x": torch.randn(64, 256, dtype=torch.bfloat16)}]
    _, norm, _, _ = rank_main._step(config, rec, torch.device("cpu"), model, params,
                                    optimizer, None, batches, 0)
    exact = sum(float((g.double() ** 2).sum()) for g in seen) ** 0.5
    in_bf16 = float(torch.nn.utils.get_total_norm(seen))
    assert float(norm) == pytest.approx(exact, rel=1e-6)
    assert abs(in_bf16 - exact) > 1e-4 * exact  # what the old norm was off by
