"""The block-scaled recipes: MXFP8 trains through torchao's MX training config (emulated on
the CPU, said so), its matmul FLOPs are filed under mxfp8 and its quantised weights are
weight copies; NVFP4 is native on compute capability 10.x and AmpScope's emulation
elsewhere (tests/engine/test_nvfp4_emulated.py); MXFP4, which torchao 0.18 cannot train,
says so."""

import pytest
import torch
from torch import nn
from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe
from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear
from torchao.prototype.mx_formats.mx_tensor import MXTensor
from transformers import AutoConfig, AutoModelForCausalLM

from engine.core.config import RunConfig, parse_precisions
from engine.measure import gating
from engine.measure.device import probe
from engine.measure.flops import blended_peak
from engine.measure.memtrack import MemoryWatcher
from engine.measure.peaks import peak_flops
from engine.run.trial import run_trial
from tests.engine.families import FAMILIES

CPU = probe("cpu")


def _model(tmp_path, family: str | None) -> str:
    if family is None:
        return "tiny"
    FAMILIES[family]().save_pretrained(tmp_path)
    return str(tmp_path)


def _mx_weights(model_ref: str) -> int:
    """Weights of the Linear layers whose both dims are whole 32-element blocks, the tied
    or untied LM head left out, counted on a freshly built model (GPT-2's Conv1D is a
    Linear with its weight transposed)."""
    from transformers.pytorch_utils import Conv1D

    cfg = AutoConfig.from_pretrained(model_ref) if model_ref != "tiny" else None
    if cfg is None:
        from engine.models.load import load_config, resolve_source
        cfg, _ = load_config(resolve_source("tiny"), False)
    net = AutoModelForCausalLM.from_config(cfg)
    total = 0
    for name, m in net.named_modules():
        if isinstance(m, nn.Linear):
            k, n = m.in_features, m.out_features
        elif isinstance(m, Conv1D):
            k, n = m.weight.shape
        else:
            continue
        if k % 32 == 0 and n % 32 == 0 and "lm_head" not in name:
            total += k * n
    return total


@pytest.mark.parametrize("family", [None, "llama-gqa"])
def test_mxfp8_trains_emulated_with_flops_under_mxfp8(tmp_path, family):
    model = _model(tmp_path, family)
    config = RunConfig(model=model, precisions=("mxfp8",), batch_size=2, seq_len=32, steps=2,
                       warmup=0, device="cpu", isolation="inline", profile_step=False)
    result = run_trial(config, "mxfp8", CPU, lambda e: None, lambda: False)
    assert result.status == "ok", result.reason
    assert result.support == "emulated" and "not representative" in result.support_reason
    assert any(n.startswith("emulated:") for n in result.notes)
    assert any("MXFP8 training of" in n and "RCEIL" in n and "emulated" in n
               for n in result.notes)
    tokens = 2 * 32
    # forward, input-gradient and weight-gradient GEMMs of every converted layer
    assert result.flops.by_peak_dtype["mxfp8"] == 6 * _mx_weights(model) * tokens
    assert "fp8" not in result.flops.by_peak_dtype
    assert result.summary.final_loss == result.summary.final_loss  # finite, not NaN


def test_mxfp8_blended_peak_uses_the_mxfp8_rate():
    flops = {"bf16": 1.0e9, "mxfp8": 3.0e9}
    b200 = "NVIDIA B200"
    rates = {k: peak_flops(b200, k).flops_per_s for k in flops}
    assert rates["mxfp8"] and rates["bf16"]
    blend = blended_peak(flops, lambda k: peak_flops(b200, k))
    assert blend.flops_per_s == pytest.approx(4.0e9 / (1.0e9 / rates["bf16"]
                                                        + 3.0e9 / rates["mxfp8"]))


def test_mx_quantised_weights_are_weight_copies():
    """Every storage of the weight's MXTensor (e4m3 data and e8m0 scales) is filed as a
    weight copy, the input's as activations: checked against the storages torchao made."""
    cfg = MXFP8TrainingOpConfig.from_recipe(MXFP8TrainingRecipe.MXFP8_EMULATED_RCEIL)
    layer = MXFP8Linear(64, 96, bias=True, kernel_preference=cfg.kernel_preference,
                        scale_calculation_mode=cfg.scale_calculation_mode)
    x = torch.randn(4, 64)
    made = []
    to_mx = MXTensor.to_mx

    def keep(*args, **kwargs):
        out = to_mx(*args, **kwargs)
        made.append((args[0], out))
        return out

    watcher = MemoryWatcher("cpu")
    watcher.track(layer.parameters(), "params")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(MXTensor, "to_mx", staticmethod(keep))
        with watcher:
            out = layer(x)
            live = watcher.live()

    def nbytes(mx):
        return mx.qdata.untyped_storage().nbytes() + mx.scale.untyped_storage().nbytes()

    weight = [mx for src, mx in made if src is layer.weight]
    inputs = [mx for src, mx in made if src is not layer.weight]
    assert len(weight) == 1 and len(inputs) == 1
    assert weight[0].qdata.dtype == torch.float8_e4m3fn
    assert weight[0].scale.numel() == 64 * 96 // 32  # one e8m0 scale per 32 elements
    assert live["weight_copies"] == nbytes(weight[0])
    # the input's MX form and the output are activations (beside torchao's scratch)
    assert live["activations"] >= nbytes(inputs[0]) + out.untyped_storage().nbytes()


@pytest.mark.parametrize(("props", "support"), [
    (dict(name="NVIDIA B200", major=10, minor=0), "native"),
    (dict(name="NVIDIA H100 80GB HBM3", major=9, minor=0), "emulated"),
    (dict(name="NVIDIA GeForce RTX 5090", major=12, minor=0), "emulated"),
    (dict(name="NVIDIA A100-SXM4-80GB", major=8, minor=0), "emulated"),
    (dict(name="AMD Instinct MI355X", major=9, minor=5, gcnArchName="gfx950:sramecc+:xnack-"),
     "emulated"),
])
def test_mxfp8_native_only_on_compute_capability_10(props, support):
    class Props:  # the fields torch.cuda.get_device_properties returns
        pass

    p = Props()
    for k, v in props.items():
        setattr(p, k, v)
    dev = gating.DeviceDescription.from_properties(p)
    assert gating.verdict("mxfp8", dev).support == support
    nvfp4 = gating.verdict("nvfp4", dev)
    assert nvfp4.support == support  # emulated by AmpScope where torchao has no kernels
    if nvfp4.support == "emulated":
        assert "has no FP4 Tensor Cores" in nvfp4.reason
        assert "speed is not representative" in nvfp4.reason


def test_mxfp4_is_refused_with_an_n_a_reason():
    with pytest.raises(ValueError, match=r"mxfp4: n/a: torchao 0.18 has no MXFP4 training"):
        parse_precisions("bf16-amp,mxfp4")


def test_mx_shapes_not_in_whole_blocks_are_refused_before_loading():
    config = RunConfig(model="tiny", precisions=("mxfp8",), batch_size=1, seq_len=40,
                       steps=1, warmup=0, device="cpu", isolation="inline")
    result = run_trial(config, "mxfp8", CPU, lambda e: None, lambda: False)
    assert result.status == "unsupported"
    assert result.reason == (
        "mxfp8 GEMMs need every dimension to be a multiple of 32, and tokens per micro-batch "
        "(batch x sequence = 40) is not: pick a batch size and sequence length whose product "
        "is a multiple of 32")


def test_emulated_formats_are_left_out_of_the_speed_ranking():
    import dataclasses

    from engine.record.compare import comparison_rows, speed_verdict
    from engine.record.verdict import verdict
    from tests.engine.verdict_records import GiB, record, trial

    fp32 = trial("fp32", 100.0, 8 * GiB, 3.0)
    bf16 = trial("bf16-amp", 100.0, 8 * GiB, 3.0, seed=3)
    # emulated MXFP8 twice as fast in this made-up record: still no speed to rank
    mx = dataclasses.replace(trial("mxfp8", 50.0, 8 * GiB, 3.0, seed=4), support="emulated",
                             support_reason="the CPU has no block-scaled (MX) matrix unit")
    rec = record(fp32, bf16, mx)
    speed = speed_verdict(rec.trials)
    assert "mxfp8" not in speed.text
    rows = {r.precision: r for r in comparison_rows(rec, speed)}
    assert rows["mxfp8"].speed_verdict == "emulated: not representative"
    v = verdict(rec)
    assert v.precision != "mxfp8"  # not "faster": it saves no memory either
    (fig,) = [f for f in v.figures if f.precision == "mxfp8"]
    assert fig.judgement == "not better"
    # without an fp32 baseline the row still says why its speed is not compared
    no_base = record(bf16, mx)
    assert {r.precision: r.speed_verdict for r in comparison_rows(no_base)}["mxfp8"] == \
        "emulated: not representative"
    # the same record without the gating verdict would rank mxfp8 first
    plain = record(fp32, bf16, dataclasses.replace(mx, support=None))
    assert speed_verdict(plain.trials).ranking[0] == ("mxfp8",)


def test_an_optimizer_suffix_keeps_its_recipes_gating_verdict():
    """mxfp8+adamw8bit runs emulated like mxfp8: left out of the speed ranking, said so."""
    config = RunConfig(model="tiny", precisions=("mxfp8+adamw8bit",), batch_size=2,
                       seq_len=32, steps=1, warmup=0, device="cpu", isolation="inline",
                       profile_step=False)
    result = run_trial(config, "mxfp8+adamw8bit", CPU, lambda e: None, lambda: False)
    assert result.status == "ok", result.reason
    assert (result.support, result.support_reason) == (
        CPU.verdict("mxfp8").support, CPU.verdict("mxfp8").reason)
    assert result.support == "emulated"
    assert CPU.verdict("bf16-amp+adamw8bit").support == "native"
