"""Emulated NVFP4 (engine/measure/nvfp4_quant.py, nvfp4_linear.py) against torchao's own
NVFP4 round trip and against a fake-quantised GEMM written here from the recipe's spec
(Transformer Engine's reference NVFP4 recipe: 1x16 blocks, 16x16 for weights, e4m3 block
scales under an fp32 tensor scale, a 16-point Hadamard transform on the weight-gradient
GEMM's operands, gradients rounded stochastically)."""

import contextlib
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale

from engine.core.config import RunConfig
from engine.core.recipes import recipe
from engine.measure import nvfp4_linear, nvfp4_quant, nvml
from engine.measure.device import DeviceInfo, probe
from engine.measure.flops import count_flops
from engine.run.trial import run_trial

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
TE_SIGNS = [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]


def sqnr_db(x, q):
    x = x.double()
    return (10 * torch.log10(x.pow(2).sum() / (x - q.double()).pow(2).sum())).item()


def torchao_round_trip(x):
    x = x.contiguous()
    scale = per_tensor_amax_to_scale(x.abs().max())
    return NVFP4Tensor.to_nvfp4(x, per_tensor_scale=scale).dequantize(torch.float32)


def spec_quant(x, rows=1, u=None):
    """NVFP4 from the spec: tensor scale amax / (448 * 6); per rows x 16 tile an e4m3 scale
    of tile amax / 6 in its units; elements to the nearest e2m1 value, or (given uniform
    draws ``u``) to the upper neighbour with probability of the distance from the lower."""
    x = x.double()
    m, k = x.shape
    tscale = x.abs().max() / (448 * 6)
    amax = x.abs().reshape(m // rows, rows, k // 16, 16).amax(dim=(1, 3), keepdim=True)
    block = (amax / 6 / tscale).float().clamp(2**-9, 448).to(torch.float8_e4m3fn).double()
    decode = (block * tscale).expand(-1, rows, -1, 16).reshape(m, k)
    v = (x / decode).clamp(-6, 6)
    grid = E2M1.double()
    if u is None:
        mag = grid[(v.abs()[..., None] - grid).abs().argmin(-1)]
    else:
        i = ((v.abs()[..., None] >= grid).sum(-1) - 1).clamp(0, 6)
        lo, hi = grid[i], grid[i + 1]
        mag = torch.where(u.double() < (v.abs() - lo) / (hi - lo), hi, lo)
    return mag * v.sign() * decode


def te_hadamard():
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < 16:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return torch.diag(torch.tensor(TE_SIGNS, dtype=torch.float64)) @ h / 4


def test_activation_quantiser_is_torchao_s_nvfp4_round_trip():
    torch.manual_seed(0)
    w = (torch.randn(64, 128) * 0.02).bfloat16()
    ours = nvfp4_quant.fake_quantize(w)
    assert torch.equal(ours, torchao_round_trip(w))
    assert sqnr_db(w, ours) == pytest.approx(20.4, abs=0.3)  # the figure
    assert sqnr_db(w, ours) == pytest.approx(sqnr_db(w, spec_quant(w.float())), abs=0.05)


def test_weights_quantise_in_16x16_tiles():
    torch.manual_seed(1)
    # every row of a 16-row tile has the same magnitudes: a 16x16 tile's amax is then each
    # 1x16 block's, so the tile quantiser must equal torchao's 1x16 round trip exactly
    base = torch.randn(4, 1, 128).expand(4, 16, 128)
    signs = torch.randint(0, 2, (4, 16, 128)) * 2 - 1
    w = (base * signs).reshape(64, 128)
    assert torch.equal(nvfp4_quant.fake_quantize(w, 16), torchao_round_trip(w))
    # a general weight: as the spec's tiles, and near 20 dB (a shared scale per 256 costs
    # a little against 1x16)
    w = torch.randn(64, 128) * 0.02
    tiled = nvfp4_quant.fake_quantize(w, 16)
    # fp32 against the spec's fp64: equal to float32's precision
    assert torch.allclose(tiled.double(), spec_quant(w, 16), rtol=1e-6, atol=1e-12)
    assert 18.5 < sqnr_db(w, tiled) < sqnr_db(w, torchao_round_trip(w))


def test_stochastic_rounding_is_unbiased_and_draws_from_its_own_generator():
    torch.manual_seed(2)
    x = torch.randn(32, 64)
    before = torch.get_rng_state()
    gen = torch.Generator().manual_seed(5)
    draws = torch.stack([nvfp4_quant.fake_quantize(x, 1, gen) for _ in range(400)])
    assert torch.equal(torch.get_rng_state(), before)
    # each draw is one of the two e2m1 neighbours the spec names (drawn with its u's)
    gen2 = torch.Generator().manual_seed(5)
    u = torch.rand(x.shape, generator=gen2)
    assert torch.allclose(draws[0].double(), spec_quant(x, 1, u), rtol=1e-6, atol=1e-12)
    nearest = sqnr_db(x, nvfp4_quant.fake_quantize(x))
    assert sqnr_db(x, draws[0]) < nearest  # one draw is noisier than rounding to nearest
    assert sqnr_db(x, draws.mean(0)) > nearest + 10  # but its mean is the value


def test_the_rotation_is_te_s_hadamard_transform():
    x = torch.randn(6, 48)
    expect = (x.double().reshape(-1, 16) @ te_hadamard()).reshape(6, 48)
    assert torch.allclose(nvfp4_quant.rotate(x).double(), expect, atol=1e-5)


@pytest.mark.parametrize("tokens", [48, 21])  # 21: zero-padded to 32 for the transform
def test_forward_and_backward_gemms_match_a_fake_quantised_computation(tokens):
    torch.manual_seed(3)
    dense = nn.Linear(64, 32)
    layer = nvfp4_linear.EmulatedNVFP4Linear(dense, torch.Generator().manual_seed(9))
    x = torch.randn(tokens, 64, requires_grad=True)
    dy = torch.randn(tokens, 32)
    y = layer(x)
    y.backward(dy)
    w, b = dense.weight.detach(), dense.bias.detach()
    wq = spec_quant(w, 16)
    expect_y = spec_quant(x.detach()) @ wq.T + b.double()
    gen = torch.Generator().manual_seed(9)  # the layer's draws, in its documented order
    u_dgrad = torch.rand(dy.shape, generator=gen)
    pad = -tokens % 16
    h = te_hadamard()

    def rotated_tokens_last(t):
        t = torch.nn.functional.pad(t.double().T, (0, pad))
        return (t.reshape(-1, 16) @ h).reshape(t.shape)

    dy_t = rotated_tokens_last(dy)
    u_wgrad = torch.rand(dy_t.shape, generator=gen)
    expect_dx = spec_quant(dy, 1, u_dgrad) @ wq
    expect_dw = spec_quant(dy_t, 1, u_wgrad) @ spec_quant(rotated_tokens_last(x.detach())).T

    def rel(a, b):
        return ((a.double() - b).norm() / b.norm()).item()

    assert rel(y, expect_y) < 1e-5
    assert rel(x.grad, expect_dx) < 1e-5
    assert rel(dense.weight.grad, expect_dw) < 1e-3  # the rotation's float order differs
    assert torch.equal(dense.bias.grad, dy.sum(0))
    exact_dw = dy.double().T @ x.detach().double()
    assert 0.01 < rel(dense.weight.grad, exact_dw) < 0.5  # quantised, but the same GEMM


def test_flops_are_filed_under_nvfp4_and_the_global_rng_is_left_alone():
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 16))
    assert nvfp4_linear.convert(model, lambda m, n: isinstance(m, nn.Linear), seed=0) == 2
    x = torch.randn(2, 16, 64)
    before = torch.get_rng_state()
    counted = count_flops(lambda: model(x).sum().backward())
    assert torch.equal(torch.get_rng_state(), before)
    # forward, input gradient and weight gradient: 2 x tokens x in x out each
    assert counted.by_peak_dtype == {"nvfp4": 3 * 2 * 32 * (64 * 48 + 48 * 16)}
    assert recipe("nvfp4").peak_dtype == "nvfp4"


def test_a_step_draws_from_the_global_rng_what_a_bf16_amp_step_draws():
    """Stochastic rounding has its own generator: a GPT-2 step with dropout on leaves torch's
    global RNG where the same bf16-amp step leaves it, so the data order and dropout masks of
    an nvfp4 trial are the other trials' and only the format differs (the Conv1D to Linear
    swap draws nothing either)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_embd=64, n_layer=1, n_head=4, vocab_size=128, n_positions=32,
                     resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    ids = torch.randint(0, 128, (2, 16))
    states = []
    for emulate in (False, True):
        torch.manual_seed(0)
        model = GPT2LMHeadModel(cfg).train()
        if emulate:
            from engine.models.load import conv1d_to_linear

            conv1d_to_linear(model)
            assert nvfp4_linear.convert(model, lambda m, n: isinstance(m, nn.Linear)
                                        and "lm_head" not in n, seed=0) == 4
        if not emulate:
            start = torch.get_rng_state()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        states.append(torch.get_rng_state())
    assert not torch.equal(states[0], start)  # dropout drew
    assert torch.equal(states[0], states[1])  # from the same seed, through the same draws


def test_per_layer_sqnr_is_the_spec_s_rounding_of_weight_and_input():
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine.measure import quant_error

    torch.manual_seed(6)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=1, num_attention_heads=4,
                                         num_key_value_heads=2, vocab_size=128))
    nvfp4_linear.convert(model, lambda m, n: isinstance(m, nn.Linear) and "lm_head" not in n,
                         seed=0)
    inputs = {}

    def keep_input(name):
        def hook(_module, args):
            inputs[name] = args[0].detach().reshape(-1, args[0].shape[-1])
        return hook

    for name, m in model.named_modules():
        if isinstance(m, nvfp4_linear.EmulatedNVFP4Linear):
            m.register_forward_pre_hook(keep_input(name))
    batch = {"input_ids": torch.randint(0, 128, (2, 16))}
    measured = quant_error.measure(model, recipe("nvfp4"), batch, torch.device("cpu"))
    rows = {r.name: r for r in measured.layers}
    assert set(inputs) <= set(rows) and len(inputs) == 7
    for name, x in inputs.items():
        w = model.get_submodule(name).weight.detach()
        assert rows[name].weight_db == pytest.approx(sqnr_db(w, spec_quant(w, 16)), abs=1e-4)
        assert rows[name].input_db == pytest.approx(sqnr_db(x, spec_quant(x)), abs=1e-4)
        assert 18.5 < rows[name].weight_db < 20.5


def test_an_untimed_measurement_puts_the_rounding_generator_back():
    from engine.measure.untouched import untouched

    model = nn.Sequential(nn.Linear(32, 32))
    nvfp4_linear.convert(model, lambda m, n: isinstance(m, nn.Linear), seed=0)
    x = torch.randn(16, 32)
    before = model[0].generator.get_state()
    with untouched(model, torch.device("cpu")):
        model(x).sum().backward()  # a measurement's backward draws from it
        assert not torch.equal(model[0].generator.get_state(), before)
    assert torch.equal(model[0].generator.get_state(), before)


H200 = SimpleNamespace(name="NVIDIA H200", major=9, minor=0, total_memory=141 * 10**9,
                       multi_processor_count=132, uuid="GPU-h200", pci_domain_id=0,
                       pci_bus_id=0x19, pci_device_id=0)


def test_an_nvfp4_trial_on_an_h200_is_emulated_with_fp4_flops(monkeypatch):
    """The DeviceInfo probe builds on an H200 (no FP4 Tensor Cores), its trial run on the
    CPU as tests/engine/test_gpu_figures.py runs its MIG slice."""
    with monkeypatch.context() as m:
        m.setattr(torch.cuda, "is_available", lambda: True)
        m.setattr(torch.cuda, "device_count", lambda: 1)
        m.setattr(torch.cuda, "get_device_properties", lambda i: H200)
        m.setattr(nvml, "handle_for", lambda uuid, bus=None: None)
        info = probe("cuda:0")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(DeviceInfo, "torch_device", property(lambda self: torch.device("cpu")))
    monkeypatch.setattr(DeviceInfo, "device_context", lambda self: contextlib.nullcontext())
    verdict = info.verdict("nvfp4")
    assert verdict.support == "emulated"
    assert verdict.reason.startswith("NVIDIA H200 (compute capability 9.0) has no FP4 Tensor")
    config = RunConfig(model="tiny", precisions=("nvfp4",), batch_size=2, seq_len=32, steps=2,
                       warmup=0, device="cpu", isolation="inline", profile_step=False)
    result = run_trial(config, "nvfp4", info, lambda e: None, lambda: False)
    assert result.status == "ok", result.reason
    assert f"emulated: {verdict.reason}" in result.notes
    assert any("EmulatedNVFP4Linear" in n for n in result.notes)
    assert set(result.flops.by_peak_dtype) == {"nvfp4", "bf16"}  # the tied head stays bf16
    assert all(s.loss is not None for s in result.steps)
