"""FSDP2 at world size 8 in one process: torch's fake process group (every collective
returns at once, data untouched) lets rank 0 of 8 run the real rank loop, so the bytes
each collective carries are the ones eight real ranks would put through it.

Expected bytes are computed here from the tiny preset's parameters (built here with
transformers) and the recipe's dtypes. DDP cannot run on the fake group: its reducer
reads the all-reduce's future, which the fake group completes without a value; DDP's
bytes are checked with two real gloo ranks in test_distributed.py.
"""

import json

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.testing._internal.distributed.fake_pg import FakeStore

from engine.config import RunConfig
from engine.distributed import rank_main
from engine.distributed.recipes import dist_recipe
from engine.trackers import StepTimer
from tests.engine.test_distributed import ROOT, _unique_params

WORLD = 8
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@pytest.fixture
def fake_world():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def tiny_units():
    """(parameters per transformer block, parameters outside them) of the tiny preset."""
    from transformers import GPT2Config, GPT2LMHeadModel

    preset = json.loads((ROOT / "resources" / "presets.json").read_text())["presets"][0]
    cfg = dict(preset["config"])
    cfg.pop("model_type")
    model = GPT2LMHeadModel(GPT2Config(**cfg))
    # every dim 0 divides by 8: the shards need no padding, so the payloads are exact
    assert all(p.shape[0] % WORLD == 0 for p in model.parameters())
    blocks = [sum(p.numel() for p in block.parameters()) for block in model.transformer.h]
    return blocks, _unique_params(model) - sum(blocks)


@pytest.mark.parametrize(("precision", "gathered", "reduced", "accum", "scaler"), [
    ("fp32", "float32", "float32", 1, False),
    ("bf16-amp", "bfloat16", "float32", 2, False),  # MixedPrecisionPolicy(bf16, fp32)
    ("bf16-amp@bf16", "bfloat16", "bfloat16", 1, False),  # gradients reduced in bf16
    ("fp16-amp", "float16", "float32", 1, True),  # the sharded GradScaler
])
def test_fsdp2_collective_bytes_at_world_size_8(precision, gathered, reduced, accum, scaler,
                                                fake_world, tiny_units, tmp_path, sync_guard,
                                                monkeypatch):
    # AmpScope's own reductions (loss, gradient norm) wait until the timed steps are over;
    # a DTensor reduces a partial result through the functional all-reduce. The sharded
    # GradScaler's found-inf agreement is the recipe's own and stays in the step.
    sync_guard.mark_calls(StepTimer, "start", "start")
    sync_guard.mark_calls(StepTimer, "stop", "stop")
    in_scaler = []
    unscale = ShardedGradScaler.unscale_

    def unscale_(self, optimizer):
        in_scaler.append(True)
        try:
            return unscale(self, optimizer)
        finally:
            in_scaler.pop()

    monkeypatch.setattr(ShardedGradScaler, "unscale_", unscale_)
    for owner in (funcol, dist):
        reduce = owner.all_reduce

        def all_reduce(*args, _reduce=reduce, **kwargs):
            sync_guard.mark("scaler all_reduce" if in_scaler else "all_reduce")
            return _reduce(*args, **kwargs)

        monkeypatch.setattr(owner, "all_reduce", all_reduce)
    config = RunConfig(model="tiny", batch_size=1, seq_len=16, steps=1, warmup=0,
                       device="cpu", grad_accum=accum, strategy="fsdp2",
                       nproc_per_node=WORLD)
    rank_main._train(config, dist_recipe(precision, "fsdp2"), torch.device("cpu"), 0, WORLD,
                     rank_main._Journal(tmp_path / "rank0.jsonl"))
    steps = sync_guard.steps()
    assert len(steps) == config.steps
    assert all(e.name != "all_reduce" for step in steps for e in step.inside)
    assert [e.name for e in steps[-1].after].count("all_reduce") == 1  # after the last
    assert any(e.name == "scaler all_reduce" for e in steps[0].inside) == scaler
    lines = [json.loads(x) for x in (tmp_path / "rank0.jsonl").read_text().splitlines()]
    comm = {(c["collective"], c["dtype"]): c
            for c in next(x for x in lines if x["type"] == "result")["comm"]}
    blocks, root = tiny_units
    # per micro-batch each block is gathered for forward and again for backward (it is
    # resharded after forward); the root stays gathered from its forward to its backward
    gather_bytes = (2 * sum(blocks) + root) * BYTES[gathered] * accum
    # the gradients cross once per step, on the last micro-batch: every parameter, whole
    scatter_bytes = (sum(blocks) + root) * BYTES[reduced]
    expected = {("all_gather", gathered): (gather_bytes, (2 * len(blocks) + 1) * accum),
                ("reduce_scatter", reduced): (scatter_bytes, len(blocks) + 1)}
    if scaler:  # the ranks agree on found-inf: one fp32 flag
        expected[("all_reduce", "float32")] = (4, 1)
    assert set(comm) == set(expected)
    for key, (payload, calls) in expected.items():
        assert comm[key]["measured_bytes"] == payload, key
        assert comm[key]["expected_bytes"] == payload, key
        assert comm[key]["calls_per_step"] == calls, key


def test_fused_sgd_has_no_dtensor_rule_so_fsdp2_ranks_keep_it_unfused(fake_world):
    """Why ``rank_optimizer`` leaves SGD unfused under FSDP2: fused AdamW steps on
    sharded parameters, fused SGD has no sharding rule in this torch."""
    from torch.distributed.fsdp import fully_shard

    def sharded():
        layer = torch.nn.Linear(WORLD, WORLD)
        fully_shard(layer)
        layer(torch.ones(2, WORLD)).sum().backward()
        return layer

    layer = sharded()
    torch.optim.AdamW(layer.parameters(), fused=True).step()
    layer = sharded()
    with pytest.raises(NotImplementedError, match="_fused_sgd_"):
        torch.optim.SGD(layer.parameters(), lr=0.1, fused=True).step()
