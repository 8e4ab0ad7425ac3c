"""int8 and nf4 traced on fake tensors (engine.run.plan_quant): as the CPU runs them, equal
to a real CPU trial on two model families; as the card runs them, LLM.int8's int8 matmuls
counted where a hand count over the config puts them. The H200's own trials of GPT-2 are
in test_plan_h200.py."""

import dataclasses

import pytest
import torch

from engine.core.recipes import recipe
from engine.models.load import dims, load_config, load_model, resolve_source
from engine.models.memory_model import shape_of
from engine.run.plan import PlanConfig, meta_shape, plan
from tests.engine.families import FAMILIES
from tests.engine.test_plan import CATEGORIES, _close, _folder, _measured


def _source(tmp_path, family: str) -> str:
    return "tiny" if family == "tiny" else _folder(tmp_path, family)


@pytest.mark.parametrize("family,checkpointing", [
    ("tiny", False), ("llama-gqa", False), ("tiny", True)])
@pytest.mark.parametrize("precision", ["int8", "nf4"])
def test_traced_as_the_cpu_runs_it_equals_a_real_cpu_trial(tmp_path, family, checkpointing,
                                                            precision):
    """tiny is GPT-2 (Conv1D layers, transposed while quantised), llama-gqa nn.Linear;
    with checkpointing, peft's reentrant checkpoint recomputes each layer."""
    source = _source(tmp_path, family)
    config = PlanConfig(model=source, precisions=(precision,), batch_size=2, seq_len=32,
                        max_batch=0, trace_as="cpu", cards=("RTX 4090",),
                        grad_checkpointing=checkpointing)
    trial = plan(config).trials[0]
    assert trial.method == "traced", trial.reason
    assert "bitsandbytes as on the CPU" in trial.memory.notes
    measured = _measured(source, precision, 2, 32, checkpointing)
    traced = trial.memory
    assert _close(traced.total_bytes, measured.total_bytes), (traced.total_bytes,
                                                              measured.total_bytes)
    for name in (*CATEGORIES, "quant_state_bytes"):
        assert _close(getattr(traced, name), getattr(measured, name)), name
    assert measured.quant_state_bytes > 0 and measured.weight_copies_bytes > 0
    assert traced.peak_phase == measured.peak_phase


def _int8_matmul_flops(family: str, tokens: int) -> int:
    """Forward FLOPs of LLM.int8's int8 matmuls, by hand from the family's config: every
    Linear of the decoder layers is quantised (the LM head is not), 2·tokens·in·out each."""
    c = FAMILIES[family]()
    head_dim = c.hidden_size // c.num_attention_heads
    kv = c.num_key_value_heads * head_dim
    h, f = c.hidden_size, c.intermediate_size
    per_layer = h * h + 2 * h * kv + h * h + 3 * h * f  # q, k, v, o; gate, up, down
    return 2 * tokens * per_layer * c.num_hidden_layers


def test_traced_as_the_card_runs_it_multiplies_in_int8(tmp_path):
    """On the card bitsandbytes trains int8 with MatMul8bitLt: int8 matmuls in forward
    (the CPU's MatMul8bitFp has none), the weight dequantised for backward."""
    source = _source(tmp_path, "llama-gqa")
    card, cpu = (plan(PlanConfig(model=source, precisions=("int8",), batch_size=2,
                                 seq_len=32, max_batch=0, trace_as=how,
                                 cards=("H100 SXM",))).trials[0] for how in ("card", "cpu"))
    assert card.method == cpu.method == "traced"
    assert card.flops_by_peak_dtype["int8"] == _int8_matmul_flops("llama-gqa", 2 * 32)
    assert "int8" not in cpu.flops_by_peak_dtype
    assert "MatMul8bitLt" in card.memory.notes and "no outlier columns" in card.memory.notes
    # the same model either way: the weights and their scales do not depend on the path
    for name in ("params_bytes", "quant_state_bytes", "optimizer_bytes"):
        assert getattr(card.memory, name) == getattr(cpu.memory, name), name
    assert card.cards[0].predicted_step_ms is not None


@pytest.mark.parametrize("family", ["tiny", "llama-gqa"])
@pytest.mark.parametrize("precision", ["nf4", "int8"])
def test_meta_shape_is_the_loaded_quantised_model(tmp_path, family, precision):
    """plan_measured matches a measured trial by the parameter count of meta_shape, which
    must be the model a real trial loads (quantised layers, LoRA adapters)."""
    source = _source(tmp_path, family)
    config = PlanConfig(model=source, precisions=(precision,), batch_size=2, seq_len=32,
                        cards=("RTX 4090",), max_batch=0)
    loaded = load_model(source, recipe(precision), torch.device("cpu"), 0, False, 8, False)
    real = shape_of(loaded.model, loaded.config, dims(loaded.config))
    assert loaded.model.get_nb_trainable_parameters()[0] == real.trainable_params > 0
    assert dataclasses.asdict(real) == dataclasses.asdict(meta_shape(config, precision))


@pytest.mark.parametrize("precision", ["int8", "nf4"])
def test_checkpointed_layers_recompute_under_the_cards_modes(monkeypatch, precision):
    """peft checkpoints a quantised model with the reentrant checkpoint, whose recompute
    runs with Python function modes off and takes no context_fn: the recompute still runs
    under the card's attention (and casts), so each SDPA call is seen twice per step,
    in forward and in backward's recompute."""
    import engine.run.plan_autocast as plan_autocast

    seen = []
    real = plan_autocast.CudaAttention.__torch_function__

    def watch(self, func, types, args=(), kwargs=None):
        if func is torch.nn.functional.scaled_dot_product_attention:
            seen.append(torch.is_grad_enabled())
        return real(self, func, types, args, kwargs)

    monkeypatch.setattr(plan_autocast.CudaAttention, "__torch_function__", watch)
    config = PlanConfig(model="tiny", precisions=(precision,), batch_size=2, seq_len=32,
                        max_batch=0, grad_checkpointing=True, cards=("H200",))
    trial = plan(config).trials[0]
    assert trial.method == "traced", trial.reason
    layers = load_config(resolve_source("tiny"))[0].n_layer
    # the warm-up's forward and the watched step's (no grad: reentrant checkpointing), then
    # the watched step's recompute in backward
    assert seen == [False] * 2 * layers + [True] * layers


def test_the_cards_answers_are_given_to_the_tracing_thread_only():
    """The window's Plan tab traces in a thread of the window's process: the library functions
    the quantised trace swaps answer as the card only there, and as torch does elsewhere."""
    import threading

    import torch

    from engine.run.plan_quant import bitsandbytes_as

    def asks() -> bool:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return torch.is_autocast_enabled()  # no argument: CUDA's autocast

    other: list[bool] = []
    with bitsandbytes_as(card=True):
        here = asks()  # the card's region is the trace's CPU region
        thread = threading.Thread(target=lambda: other.append(asks()))
        thread.start()
        thread.join()
    assert here is True and other == [False]
    assert asks() is False  # restored
