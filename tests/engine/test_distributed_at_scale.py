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

from engine.core.config import RunConfig
from engine.distributed import rank_main
from engine.distributed.recipes import dist_recipe
from engine.measure.trackers import StepTimer
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
    ("fp8", "bfloat16", "float32", 1, False),  # float8 Linears: weights gathered in bf16
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


def _llama_folder(path):
    """A tiny Llama config in a folder (a model source without weights): a second family,
    bias-free Linears and RMSNorm, untied LM head."""
    from transformers import LlamaConfig

    LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                max_position_embeddings=64).save_pretrained(path)
    return str(path)


def _family_model(source: str):
    from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config

    if source == "tiny":
        cfg = dict(json.loads((ROOT / "resources" / "presets.json").read_text())
                   ["presets"][0]["config"])
        cfg.pop("model_type")
        return AutoModelForCausalLM.from_config(GPT2Config(**cfg))
    return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source))


def _comm_of(precision: str, source: str, accum: int, tmp_path) -> dict:
    config = RunConfig(model=source, batch_size=1, seq_len=16, steps=1, warmup=0,
                       device="cpu", grad_accum=accum, strategy="fsdp2",
                       nproc_per_node=WORLD)
    journal = tmp_path / f"{precision}.jsonl"
    rank_main._train(config, dist_recipe(precision, "fsdp2"), torch.device("cpu"), 0, WORLD,
                     rank_main._Journal(journal))
    lines = [json.loads(x) for x in journal.read_text().splitlines()]
    return {(c["collective"], c["dtype"]): c
            for c in next(x for x in lines if x["type"] == "result")["comm"]}


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_fp8_all_gather_puts_float8_weights_on_the_wire_at_world_size_8(family, fake_world,
                                                                        tmp_path):
    source = "tiny" if family == "gpt2" else _llama_folder(tmp_path / "llama")
    model = _family_model(source)
    blocks = max((m for m in model.modules() if isinstance(m, torch.nn.ModuleList)), key=len)
    # in each block the matmul weights are its 2-D parameters, all float8-shaped (both dims
    # divisible by 16); the rest (biases, norms) and everything outside the blocks (the
    # embeddings, the final norm, the LM head, kept out of float8) stay high precision
    weights = [[p.numel() for p in block.parameters() if p.dim() == 2] for block in blocks]
    assert all(d % 16 == 0 for block in blocks for p in block.parameters() if p.dim() == 2
               for d in p.shape)
    others = [sum(p.numel() for p in block.parameters()) - sum(w)
              for block, w in zip(blocks, weights)]
    total = _unique_params(model)
    root = total - sum(sum(w) for w in weights) - sum(others)
    assert all(p.shape[0] % WORLD == 0 for p in model.parameters())  # no shard padding
    accum = 2
    plain = _comm_of("fp8", source, accum, tmp_path)
    ag = _comm_of("fp8-fsdp-ag", source, accum, tmp_path)
    # plain fp8: FSDP2 gathers bf16 weights (cast to float8 after), each block twice per
    # micro-batch (forward, and backward after the reshard), the root once
    bf16_blocks = sum(sum(w) + o for w, o in zip(weights, others))
    assert plain[("all_gather", "bfloat16")]["measured_bytes"] == (
        (2 * bf16_blocks + root) * 2 * accum)
    assert not any(dtype == "uint8" for _, dtype in plain)
    # float8 all-gather: 1 byte per float8 weight element, 2 (bf16) for the rest of a
    # block, gathered as one uint8 buffer; the root has no float8 weight and stays bf16
    fp8_blocks = sum(sum(w) * 1 + o * 2 for w, o in zip(weights, others))
    expected = {("all_gather", "uint8"): (2 * fp8_blocks * accum, 2 * len(blocks) * accum),
                ("all_gather", "bfloat16"): (root * 2 * accum, accum),
                # the scale precompute: one all-reduce of every float8 weight's fp32 amax
                ("all_reduce", "float32"): (4 * sum(len(w) for w in weights), 1),
                ("reduce_scatter", "float32"): (total * 4, len(blocks) + 1)}
    assert set(ag) == set(expected)
    for key, (payload, calls) in expected.items():
        assert ag[key]["measured_bytes"] == payload, key
        assert ag[key]["expected_bytes"] == payload, key
        assert ag[key]["calls_per_step"] == calls, key
    # the weights' share of the wire halves
    saved = plain[("all_gather", "bfloat16")]["measured_bytes"] - sum(
        ag[("all_gather", d)]["measured_bytes"] for d in ("uint8", "bfloat16"))
    assert saved == 2 * sum(sum(w) for w in weights) * accum
