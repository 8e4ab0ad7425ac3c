import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM, GPT2Config

from engine.core.recipes import autocast_for, recipe
from engine.measure.flops import (
    ATTENTION_FLOPS,
    attention_stacks,
    blended_peak,
    count_flops,
    flop_formulas,
    matmul_param_counts,
    model_flops,
)
from engine.measure.peaks import PeakLookup
from engine.models.load import dims, load_model, make_batches, model_class, task_of
from tests.engine.families import FAMILIES

LAYERS, HIDDEN, VOCAB = 2, 64, 256
BATCH, SEQ = 2, 32
# per layer c_attn 64x192, attn c_proj 64x64, c_fc 64x256, mlp c_proj 256x64; lm_head 64x256
MATMUL = LAYERS * (64 * 192 + 64 * 64 + 64 * 256 + 256 * 64) + 64 * 256
CPU = torch.device("cpu")


def tiny_gpt2(attention: str = "sdpa"):
    torch.manual_seed(0)
    config = GPT2Config(n_layer=LAYERS, n_head=2, n_embd=HIDDEN, vocab_size=VOCAB,
                        n_positions=128, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attention)


def train_step(model, batch=None):
    if batch is None:
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
        batch = {"input_ids": ids, "labels": ids}

    def step():
        model(**batch).loss.backward()

    return step


def model_count(model, config, seq=SEQ, tokens=BATCH * SEQ):
    total, trainable = matmul_param_counts(model)
    return model_flops(tokens=tokens, matmul_params=total, trainable_matmul_params=trainable,
                       attention=attention_stacks(dims(config), seq))


def rotary_flops(model, step) -> int:
    """FLOPs of the rotary embeddings' own matmul in one ``step``: transformers 5.17 makes
    the position frequencies as an inverse-frequency x position-id bmm (k = 1, 2 FLOPs per
    frequency and position), 5.23 by a broadcast product, no matmul. They ran, so the
    hardware count has them, but they are no part of the model count."""
    counter = FlopCounterMode(display=False, custom_mapping=ATTENTION_FLOPS)
    with counter:
        step()
    model.zero_grad(set_to_none=True)
    found = sum(sum(ops.values()) for name, ops in counter.get_flop_counts().items()
                if name.endswith("rotary_emb"))
    # one call per forward, for position ids of one row: 2 x (rotary dim / 2) x SEQ
    per_forward = sum(2 * m.inv_freq.numel() * SEQ for name, m in model.named_modules()
                      if name.endswith("rotary_emb"))
    assert found in (0, per_forward)
    return found


def test_matmul_params_count_conv1d_and_tied_head():
    assert matmul_param_counts(tiny_gpt2()) == (MATMUL, MATMUL)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_model_flops_equal_flop_counter_mode_on_eager_attention(family):
    # eager attention runs QK^T and AV as plain matmuls, nothing is recomputed: what ran
    # is exactly what the model needs, on every family (GQA, head_dim x heads != hidden,
    # encoder-decoders with cross-attention), beside transformers 5.17's rotary matmul
    config = FAMILIES[family]()
    task = task_of(config)
    torch.manual_seed(0)
    model = model_class(task).from_config(config, attn_implementation="eager")
    batch = make_batches(config, task, BATCH, SEQ, 1, 0, "cpu")[0]
    counted = count_flops(train_step(model, batch))
    expected, formula = model_count(model, config)
    assert counted.total == expected + rotary_flops(model, train_step(model, batch))
    assert counted.by_peak_dtype == {"fp32": counted.total}
    assert f"{expected:,}" in formula


def test_attention_uses_heads_times_head_dim_not_hidden():
    config = FAMILIES["llama-head-dim"]()  # hidden 96, 6 heads of 24
    d = dims(config)
    assert (d["hidden"], d["attention_width"], d["kv_heads"]) == (96, 144, 6)
    (stack,) = attention_stacks(d, SEQ)
    tokens = BATCH * SEQ
    total, _ = model_flops(tokens=tokens, matmul_params=0, trainable_matmul_params=0,
                           attention=(stack,))
    assert total == 12 * 2 * SEQ * 6 * 24 * tokens  # QK^T and AV, forward and backward
    gqa = dims(FAMILIES["llama-gqa"]())
    assert (gqa["kv_heads"], gqa["attention_width"]) == (3, 96)  # queries keep all 6 heads


@pytest.mark.parametrize("op", list(ATTENTION_FLOPS), ids=str)
def test_grouped_query_attention_counts_every_query_head(op):
    # transformers calls SDPA with enable_gqa=True: K and V have 2 heads for the query's 6,
    # and the kernel scores every query head against every key (torch 2.11's own formulas
    # reject these shapes). Forward: QK^T and AV, 2 FLOPs each per (head, query, key,
    # dim); backward: the scores again and four gradient products
    b, heads, kv_heads, s, d = 2, 6, 2, 32, 16
    q, kv = torch.empty(b, heads, s, d, device="meta"), torch.empty(b, kv_heads, s, d,
                                                                    device="meta")
    backward = "backward" in str(op)
    args = (q, q, kv, kv) if backward else (q, kv, kv)
    flops = flop_formulas()[op](*args, out_val=None)
    assert flops == (5 if backward else 2) * 2 * b * heads * s * s * d


def test_encoder_decoder_has_self_and_cross_attention_stacks():
    stacks = attention_stacks(dims(FAMILIES["t5"]()), SEQ)
    assert [(s.name, s.layers, s.width) for s in stacks] == [
        ("encoder self-attention", 2, 144), ("decoder self-attention", 2, 144),
        ("decoder cross-attention", 2, 144)]


def test_hardware_flops_include_recomputation_model_flops_do_not():
    model = tiny_gpt2()  # sdpa: the CPU flash kernel recomputes QK^T in backward
    counted = count_flops(train_step(model)).total
    expected, _ = model_count(model, model.config)
    recomputed_scores = 2 * SEQ * HIDDEN * LAYERS * BATCH * SEQ
    assert counted - expected == recomputed_scores

    checkpointed = tiny_gpt2()
    checkpointed.gradient_checkpointing_enable({"use_reentrant": False})
    checkpointed.train()
    counted_ckpt = count_flops(train_step(checkpointed)).total
    # checkpointing reruns each layer's forward (matmuls 2 FLOPs per weight and token,
    # attention forward 4·s·h) up to the last tensor backward needs: torch's non-reentrant
    # checkpoint stops there, so the MLP's output projection (256x64) is not rerun. The
    # model FLOPs stay what they were.
    rerun_weights = LAYERS * (64 * 192 + 64 * 64 + 64 * 256)
    rerun = 2 * rerun_weights * BATCH * SEQ + 4 * SEQ * HIDDEN * LAYERS * BATCH * SEQ
    assert counted_ckpt - counted == rerun
    assert model_count(checkpointed, checkpointed.config)[0] == expected


def test_frozen_lora_base_skips_weight_gradients():
    full = model_count(tiny_gpt2("eager"), tiny_gpt2().config)[0]
    model = get_peft_model(
        tiny_gpt2("eager"),
        LoraConfig(r=4, target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True),
    )
    # peft's k-bit preparation does this with checkpointing: without it the first layer,
    # fed by a frozen embedding, would also skip its input gradients
    model.enable_input_require_grads()
    total, trainable = matmul_param_counts(model)
    lora = LAYERS * 4 * ((64 + 192) + (64 + 64) + (64 + 256) + (256 + 64))
    assert (total, trainable) == (MATMUL + lora, lora)
    expected = model_count(model, tiny_gpt2().config)[0]
    assert count_flops(train_step(model)).total == expected
    # LoRA saves the base's weight gradients and pays 6 FLOPs per adapter weight
    assert full - expected == 2 * MATMUL * BATCH * SEQ - 6 * lora * BATCH * SEQ


def test_model_flops_by_hand():
    total, _ = model_flops(tokens=10, matmul_params=100, trainable_matmul_params=0,
                           attention=attention_stacks(
                               {"attention_width": 4, "n_layers": 1}, 2))
    assert total == 4 * 100 * 10 + 12 * 1 * 2 * 4 * 10


def test_autocast_flops_are_filed_under_the_half_dtype():
    model = tiny_gpt2()
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))

    def step():
        with autocast_for(recipe("bf16-amp"), CPU):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()

    counted = count_flops(step)
    assert set(counted.by_peak_dtype) == {"bf16"}
    assert sum(counted.by_peak_dtype.values()) == counted.total == sum(counted.by_op.values())


@pytest.mark.parametrize("precision", ["nf4", "int8"])
def test_quantised_trials_count_their_matmuls(tmp_path, precision):
    config = FAMILIES["llama-gqa"]()
    config.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), precision, "cpu", lora_r=8)
    model, batch = loaded.model, make_batches(config, "causal-lm", BATCH, SEQ, 1, 0, "cpu")[0]
    rec = recipe(precision)

    def step():
        with autocast_for(rec, CPU):
            loss = model(**batch).loss
        loss.backward()

    counted = count_flops(step)
    model.zero_grad(set_to_none=True)
    # torch's registry and the CPU attention formulas, without bitsandbytes'
    plain = FlopCounterMode(display=False, custom_mapping=ATTENTION_FLOPS)
    with plain:
        step()
    gemm_4bit = counted.by_op.get("bitsandbytes.gemm_4bit", 0)
    if precision == "nf4":
        # every quantised weight's forward, 2 FLOPs per weight and token, which torch's
        # registry alone does not see
        base = LAYERS * (96 * 96 + 2 * 96 * 48 + 96 * 96 + 3 * 96 * 200)
        assert gemm_4bit == 2 * base * BATCH * SEQ
    else:  # the CPU trains int8 by dequantising to fp16 and calling linear: aten sees it
        assert gemm_4bit == 0
    assert counted.total == plain.get_total_flops() + gemm_4bit
    # against the model count: without checkpointing peft leaves the embedding output
    expected, _ = model_count(model, config)
    # without grad, so layer 0's q/k/v (and their LoRA A) compute no input gradient; the
    # CPU's fused attention recomputes its scores in backward (2·s·w per token and layer)
    skipped = 2 * BATCH * SEQ * ((96 * 96 + 2 * 96 * 48) + 3 * 96 * 8)
    recomputed = 2 * SEQ * 96 * LAYERS * BATCH * SEQ
    assert counted.total == expected - skipped + recomputed + rotary_flops(model, step)
    assert counted.total == pytest.approx(expected, rel=0.05)


def test_bitsandbytes_int8_ops_are_counted_as_int8():
    import bitsandbytes  # noqa: F401  (registers the ops)

    ops = torch.ops.bitsandbytes
    m, k, n = 6, 32, 40
    a = torch.randn(m, k, dtype=torch.float16)
    ca = torch.randint(-127, 127, (m, k), dtype=torch.int8)
    cb = torch.randint(-127, 127, (n, k), dtype=torch.int8)
    sca, scb = torch.ones(m), torch.ones(n)
    outliers = torch.tensor([3, 7])

    def step():
        ops.int8_linear_matmul(ca, cb)
        ops.int8_scaled_mm(ca, cb, sca, scb)
        ops.int8_mixed_scaled_mm(a, ca, cb, sca, scb, outliers)

    counted = count_flops(step)
    mnk = 2 * m * n * k
    assert counted.by_op["bitsandbytes.int8_linear_matmul"] == mnk
    assert counted.by_op["bitsandbytes.int8_scaled_mm"] == mnk
    # the int8 product plus the fp16 product of the 2 outlier columns
    assert counted.by_op["bitsandbytes.int8_mixed_scaled_mm"] == mnk + 2 * m * n * 2
    assert set(counted.by_peak_dtype) == {"int8"}


def test_blended_peak_is_the_harmonic_mix():
    peaks = {"int8": 400e12, "fp16": 200e12}
    mix = blended_peak({"int8": 1e12, "fp16": 2e12},
                       lambda d: PeakLookup(peaks[d], f"table {d}", None))
    # 3e12 FLOPs take 1/400 + 2/200 of a second-per-TFLOP: not the int8 peak alone
    assert mix.flops_per_s == pytest.approx(3e12 / (1e12 / 400e12 + 2e12 / 200e12))
    assert 200e12 < mix.flops_per_s < 400e12


def test_trial_mfu_peak_is_blended_by_the_dtypes_the_step_ran():
    from types import SimpleNamespace

    from engine.measure.peak_choice import datasheet_peak as _peak
    from engine.measure.peaks import peak_flops

    h100 = SimpleNamespace(kind="cuda", name="NVIDIA H100 80GB HBM3", sm_count=132, mig=False)
    int8, fp16 = (peak_flops(h100.name, k).flops_per_s for k in ("int8", "fp16"))
    # an int8 trial: forward in int8, backward in fp16, as counted
    peak = _peak(h100, recipe("int8"), {"int8": 1e12, "fp16": 2e12})
    assert peak.flops_per_s == pytest.approx(3e12 / (1e12 / int8 + 2e12 / fp16))
    assert "int8 33.3%" in peak.source and "fp16 66.7%" in peak.source
    # one dtype: that dtype's own peak; nothing counted: the recipe's
    assert _peak(h100, recipe("bf16-amp"), {"bf16": 5}).flops_per_s == peak_flops(
        h100.name, "bf16").flops_per_s
    assert _peak(h100, recipe("fp8"), {}).flops_per_s == peak_flops(h100.name, "fp8").flops_per_s
    assert _peak(SimpleNamespace(kind="cpu", name="cpu"), recipe("fp32"), {}).flops_per_s is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("precision", ["int8", "nf4"])
def test_quantised_cuda_trials_count_their_matmuls(precision):
    from engine.core.config import RunConfig
    from engine.measure.device import probe
    from engine.run.trial import run_trial

    config = RunConfig(model="gpt2", batch_size=2, seq_len=128, steps=1, warmup=1,
                       device="cuda", isolation="inline")
    result = run_trial(config, precision, probe("cuda"), lambda e: None, lambda: False)
    assert result.status == "ok", result.reason
    ratio = result.flops.counted_per_step / result.flops.analytic_per_step
    assert 0.97 <= ratio <= 1.05
    op = "bitsandbytes.int8_mixed_scaled_mm" if precision == "int8" else "bitsandbytes.gemm_4bit"
    assert result.flops.by_op.get(op, 0) > 0
    if precision == "int8":
        assert "int8" in result.flops.by_peak_dtype
