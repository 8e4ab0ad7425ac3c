"""The trial's gradient norm: one foreach norm, summed in fp32, whatever the parameter count
(a norm per parameter cost GPT-2 149 kernel launches a step on an H200)."""

import math
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM

from engine.measure.grad_norm import _foreach_norm_takes_dtype, fp32_norm
from tests.engine.families import FAMILIES


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _grads(family, dtype, layers=2):
    config = FAMILIES[family]()
    for name in ("n_layer", "num_hidden_layers"):
        if hasattr(config, name):
            setattr(config, name, layers)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(dtype)
    ids = torch.randint(0, config.vocab_size, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    return [p.grad for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("family", ["gpt2", "llama-gqa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_equals_an_fp64_sum_of_squares(family, dtype):
    grads = _grads(family, dtype)
    assert {g.dtype for g in grads} == {dtype}
    expected = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))
    got = fp32_norm(grads, torch.device("cpu"))
    assert got.dtype == torch.float32
    # fp32 accumulation: a bf16 sum would be off by about 0.5%
    assert float(got) == pytest.approx(expected, rel=1e-5)


def test_the_norm_dispatches_a_fixed_number_of_ops_whatever_the_parameter_count():
    assert _foreach_norm_takes_dtype()  # torch 2.13 here; older ones fall back per tensor
    counts = {}
    for layers in (2, 6):
        grads = _grads("gpt2", torch.bfloat16, layers)
        with _Ops() as mode:
            fp32_norm(grads, torch.device("cpu"))
        counts[len(grads)] = mode.ops
    (few, small), (many, large) = sorted(counts.items())
    assert many > few + 40  # six layers hold many more gradients than two
    assert small == large  # the same ops, as many times
    assert small["aten._foreach_norm"] == 1 and sum(small.values()) <= 4
    assert fp32_norm([], torch.device("cpu")).item() == 0.0
