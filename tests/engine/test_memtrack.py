import json
import warnings

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from engine.measure.flops import matmul_param_counts
from engine.measure.memtrack import (
    MemoryWatcher,
    optimizer_tensors,
    quant_state_tensors,
    unique_bytes,
)
from engine.models.load import load_model, make_batches, model_class, task_of
from tests.engine.families import FAMILIES

BATCH, SEQ = 2, 24


def _setup(family: str, checkpointing: bool = False):
    config = FAMILIES[family]()
    task = task_of(config)
    torch.manual_seed(0)
    model = model_class(task).from_config(config)
    if checkpointing:
        model.gradient_checkpointing_enable({"use_reentrant": False})
    model.train()
    optimizer = torch.optim.AdamW(model.parameters())
    batch = make_batches(config, task, BATCH, SEQ, 1, 0, "cpu")[0]
    return model, optimizer, batch


def _step(model, optimizer, batch, autocast=None, watcher=None):
    def phase(name):
        if watcher is not None:
            watcher.phase = name

    phase("forward")
    with torch.autocast("cpu", dtype=autocast or torch.float32, enabled=autocast is not None):
        loss = model(**batch).loss
    phase("backward")
    loss.backward()
    del loss
    phase("optimizer")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _watched(model, optimizer, batch, autocast=None):
    watcher = MemoryWatcher("cpu")
    watcher.track_training(model, optimizer, batch)
    with watcher:
        _step(model, optimizer, batch, autocast, watcher)
    return watcher.result()


def _profiled_timeline(tmp_path, model, optimizer, batch, autocast=None) -> list:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        _step(model, optimizer, batch, autocast)
    path = tmp_path / "timeline.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the CPU timeline has no successor
        prof.export_memory_timeline(str(path), device="cpu")
    return json.loads(path.read_text())[1]  # bytes by category at each event


@pytest.mark.parametrize(("family", "autocast", "checkpointing"), [
    ("gpt2", None, False),
    ("llama-gqa", torch.bfloat16, False),
    ("bert", None, True),
    ("t5", None, False),
])
def test_peak_matches_torch_profiler_memory_timeline(tmp_path, family, autocast, checkpointing):
    model, optimizer, batch = _setup(family, checkpointing)
    _step(model, optimizer, batch, autocast)  # the optimiser state exists from here on
    measured = _watched(model, optimizer, batch, autocast)
    timeline = _profiled_timeline(tmp_path, model, optimizer, batch, autocast)
    profiler_peak = max(sum(sizes) for sizes in timeline)
    assert measured.peak_bytes == pytest.approx(profiler_peak, rel=0.005)
    assert sum(measured.at_peak.values()) == measured.peak_bytes
    # what existed before the step: the profiler files it as parameters, optimizer state
    # and inputs, the watcher under the same names
    params = unique_bytes(model.parameters())
    state = unique_bytes(optimizer_tensors(optimizer))
    assert params in timeline[0] and state in timeline[0]
    assert (measured.at_peak["params"], measured.at_peak["optimizer"]) == (params, state)


def test_categories_when_backward_and_the_optimiser_step_begin():
    model, optimizer, batch = _setup("gpt2")
    _step(model, optimizer, batch)
    measured = _watched(model, optimizer, batch, torch.bfloat16)
    at_backward = measured.at_phase_start["backward"]
    # autocast saves a bf16 copy of every matmul weight for backward: its own category
    matmul, _ = matmul_param_counts(model)
    assert at_backward["weight_copies"] == 2 * matmul
    assert at_backward["activations"] > 0 and at_backward["grads"] == 0
    at_step = measured.at_phase_start["optimizer"]
    assert at_step["grads"] == unique_bytes(model.parameters())  # every weight trains
    assert at_step["activations"] == at_step["weight_copies"] == 0  # freed by backward


def test_checkpointing_keeps_layer_inputs_and_reruns_a_layer_in_backward():
    plain = _watched(*_step_ready("llama-gqa"))
    model, optimizer, batch = _step_ready("llama-gqa", checkpointing=True)
    watcher = MemoryWatcher("cpu")
    watcher.track_training(model, optimizer, batch)
    seen = []

    def after_attention(module, args, output):  # layer 0's rerun, inside backward
        if watcher.phase == "backward":
            seen.append(watcher.live())

    # (the rerun stops once backward has what it needs, before the layer's own end)
    model.model.layers[0].self_attn.register_forward_hook(after_attention)
    with watcher:
        _step(model, optimizer, batch, watcher=watcher)
    ckpt = watcher.result()
    saved_plain = plain.at_phase_start["backward"]["activations"]
    saved_ckpt = ckpt.at_phase_start["backward"]["activations"]
    assert saved_ckpt < saved_plain / 2
    # the rerun layer's tensors are made in backward, inside the layer's forward: they
    # count as activations (part of one layer's worth by the end of its attention) beside
    # the layer's saved input, the only activation left by then
    (rerun,) = seen
    per_layer = (saved_plain - saved_ckpt) / 2
    layer_input = BATCH * SEQ * 96 * 4
    assert 0.2 * per_layer < rerun["activations"] - layer_input < per_layer
    assert rerun["temporaries"] < rerun["activations"] - layer_input
    # (here both peaks may be the optimiser step, where no activation is left)
    assert ckpt.peak_bytes <= plain.peak_bytes


def _step_ready(family, checkpointing=False):
    model, optimizer, batch = _setup(family, checkpointing)
    _step(model, optimizer, batch)
    return model, optimizer, batch


def test_shared_8bit_optimizer_maps_are_counted_once():
    import bitsandbytes as bnb

    params = [torch.nn.Parameter(torch.randn(n)) for n in (5000, 8192, 100)]
    optimizer = bnb.optim.AdamW8bit(params)
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer.step()
    tensors = optimizer_tensors(optimizer)
    naive = sum(t.numel() * t.element_size() for t in tensors)
    # both 8-bit tensors hold the same two 256-entry float32 maps
    assert naive - unique_bytes(tensors) == 2 * 256 * 4
    assert optimizer.state[params[0]]["qmap1"] is optimizer.state[params[1]]["qmap1"]


def test_nf4_quantisation_state_is_found_beside_the_weights(tmp_path):
    config = FAMILIES["llama-gqa"]()
    config.save_pretrained(tmp_path)
    model = load_model(str(tmp_path), "nf4", "cpu", train=False).model
    quantised = [p for p in model.parameters() if type(p).__name__ == "Params4bit"]
    absmax = sum(t.numel() * t.element_size() for t in quant_state_tensors(model)
                 if t.dtype == torch.float32 and t.numel() > 16)
    # one float32 absmax per 64-weight block of every 4-bit matrix
    assert absmax == sum(4 * p.quant_state.shape.numel() // 64 for p in quantised)
    # transformers' footprint counts parameters and buffers: the absmax is neither
    footprint = model.get_memory_footprint()
    assert footprint == unique_bytes(model.parameters()) + unique_bytes(model.buffers())
