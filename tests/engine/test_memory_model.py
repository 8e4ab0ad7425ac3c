import pytest

from engine.events import MemoryBreakdown
from engine.memory_model import predict_memory, with_errors
from engine.recipes import recipe

GPT2 = 124_439_808
GPT2_DIMS = dict(n_layers=12, hidden=768, n_heads=12, vocab=50257)
# GPT-2's attention, MLP and projection weights: 12 x (768x2304 + 768x768 + 2 x 768x3072)
GPT2_QUANTISED = 12 * (768 * 2304 + 768 * 768 + 2 * 768 * 3072)


def gpt2(precision, optimizer="adamw", total=GPT2, trainable=GPT2, quantized=0, **kw):
    args = dict(GPT2_DIMS, batch_size=4, seq_len=1024, grad_checkpointing=False) | kw
    return predict_memory(recipe(precision), optimizer, total, trainable, quantized, **args)


def small(precision, grad_checkpointing=False, **kw):
    return predict_memory(recipe(precision), "adamw", 1000, 1000, 0, n_layers=2, hidden=16,
                          n_heads=2, vocab=32, batch_size=2, seq_len=8,
                          grad_checkpointing=grad_checkpointing, **kw)


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16-amp", "bf16-amp", "fp8"])
def test_fp32_weights_with_adam_cost_16_bytes_per_param(precision):
    pred = gpt2(precision)
    assert pred.bytes_per_param["static"] == 16
    assert (pred.params_bytes, pred.grads_bytes, pred.optimizer_bytes) == (
        4 * GPT2, 4 * GPT2, 8 * GPT2)
    assert pred.master_bytes == 0
    assert pred.total_bytes == 16 * GPT2 + pred.activations_bytes
    assert f"{16 * GPT2:,}" in pred.formula


def test_mixed_precision_formula_explains_zero_accounting():
    formula = gpt2("bf16-amp").formula
    assert "master copy" in formula and "2 + fp16 grads 2" in formula and "12" in formula
    assert "ZeRO" not in gpt2("fp32").formula


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_pure_half_precision_costs_8_bytes_per_param(precision):
    pred = gpt2(precision)
    assert pred.bytes_per_param == {"weights": 2, "grads": 2, "optimizer": 4, "static": 8}
    assert pred.params_bytes == 2 * GPT2


@pytest.mark.parametrize(("optimizer", "state"), [("sgd", 0), ("adamw8bit", 2)])
def test_optimizer_state_bytes(optimizer, state):
    pred = gpt2("fp32", optimizer)
    assert pred.optimizer_bytes == state * GPT2
    assert pred.bytes_per_param["static"] == 8 + state


@pytest.mark.parametrize(("precision", "quantized_bytes"), [("int8", 1.0), ("nf4", 0.5 + 4 / 64)])
def test_quantised_base_with_lora(precision, quantized_bytes):
    lora = 12 * 8 * ((768 + 2304) + (768 + 768) + 2 * (768 + 3072))  # rank 8, four matrices
    total = GPT2 + lora
    frozen = GPT2 - GPT2_QUANTISED
    pred = gpt2(precision, total=total, trainable=lora, quantized=GPT2_QUANTISED)
    per = pred.bytes_per_param
    assert per["quantized_weights"] == quantized_bytes and per["frozen_weights"] == 4
    assert pred.params_bytes == round(GPT2_QUANTISED * quantized_bytes + frozen * 4 + lora * 4)
    assert (pred.grads_bytes, pred.optimizer_bytes) == (4 * lora, 8 * lora)
    assert f"{GPT2_QUANTISED:,} quantised" in pred.formula


def test_activations_by_hand():
    # per layer s·b·h·34·4/2 + 5·a·s²·b·4/2 = 8704·2 + 1280·2 at fp32; logits 2·8·32·(4+4+4)
    fp32 = small("fp32")
    assert fp32.activations_bytes == 2 * (8704 + 1280) * 2 + 2 * 8 * 32 * 12
    # 2-byte activations, logits 2·8·32·(2+4+4)
    assert small("bf16-amp").activations_bytes == 2 * (8704 + 1280) + 2 * 8 * 32 * 10
    # fused attention keeps no score matrices
    assert small("fp32", attention_scores_stored=False).activations_bytes == (
        2 * 8704 * 2 + 2 * 8 * 32 * 12)
    # checkpointing: each layer's fp32 input, plus one layer while it recomputes
    ckpt = small("fp32", grad_checkpointing=True)
    assert ckpt.activations_bytes == 2 * 4 * 8 * 2 * 16 + (8704 + 1280) * 2 + 2 * 8 * 32 * 12
    assert "19,968" in ckpt.formula


def test_inconsistent_inputs_say_how_to_fix():
    with pytest.raises(ValueError, match="must not exceed"):
        gpt2("fp32", trainable=GPT2 + 1)
    with pytest.raises(ValueError, match="quantized_params=0"):
        gpt2("fp32", quantized=10, trainable=GPT2 - 10)
    with pytest.raises(ValueError, match="choose from"):
        gpt2("fp32", "lion")
    with pytest.raises(ValueError, match="seq_len must be 1 or more"):
        gpt2("fp32", seq_len=0)


def test_error_percentages_against_a_measurement():
    pred = small("fp32")
    measured = MemoryBreakdown(
        params_bytes=pred.params_bytes // 2,  # predicted twice the measured: +100%
        grads_bytes=pred.grads_bytes * 4,  # predicted a quarter: -75%
        optimizer_bytes=0,  # nothing to divide by
        activations_bytes=None,
        activations_method="n/a",
        total_bytes=pred.total_bytes + 1000,
    )
    errors = with_errors(pred, measured).error_pct
    assert errors["params"] == pytest.approx(100.0)
    assert errors["grads"] == pytest.approx(-75.0)
    assert errors["total"] == pytest.approx(-100 * 1000 / (pred.total_bytes + 1000))
    assert set(errors) == {"params", "grads", "total"}
    assert pred.error_pct == {}  # the original is left as it was
