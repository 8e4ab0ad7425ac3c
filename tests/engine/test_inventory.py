import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch import nn
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, GPT2Config, GPT2LMHeadModel

from engine.measure.inventory import (
    count_params,
    count_quantized_params,
    dtype_map,
    footprint_bytes,
    module_tree,
    unique_param_bytes,
)

MIB = 2**20
TINY = dict(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=128)
# wte 256*64 + wpe 128*64 + 2 layers x (ln_1 128 + c_attn 64*192+192 + c_proj 64*64+64
# + ln_2 128 + c_fc 64*256+256 + mlp.c_proj 256*64+64) + ln_f 128; lm_head is wte.
TINY_PARAMS = 16384 + 8192 + 2 * (128 + 12480 + 4160 + 128 + 16640 + 16448) + 128


def tiny_gpt2(dtype=torch.float32):
    return GPT2LMHeadModel(GPT2Config(**TINY)).to(dtype)


def load_quantized(tmp_path, model, quant_config, dtype):
    model.save_pretrained(tmp_path)
    return AutoModelForCausalLM.from_pretrained(
        tmp_path, quantization_config=quant_config, device_map="cpu", dtype=dtype
    )


def test_dtype_map_lists_tied_weight_under_both_names():
    model = tiny_gpt2()
    rows = {row.name: row for row in dtype_map(model)}
    assert len(rows) == len(list(model.named_parameters(remove_duplicate=False)))
    assert rows["lm_head.weight"].tied_to == "transformer.wte.weight"
    assert rows["transformer.wte.weight"].tied_to is None
    attn = rows["transformer.h.0.attn.c_attn.weight"]
    assert (attn.shape, attn.dtype, attn.device) == ((64, 192), "float32", "cpu")
    assert (attn.numel, attn.bytes, attn.trainable) == (64 * 192, 64 * 192 * 4, True)
    assert attn.module_type == "Conv1D"
    assert rows["transformer.wte.weight"].module_type == "Embedding"
    assert rows["transformer.h.1.ln_2.bias"].module_type == "LayerNorm"
    assert rows["lm_head.weight"].module_type == "Linear"
    # a tied name holds no storage of its own (docs/report-schema.md): bytes add up once
    assert rows["lm_head.weight"].bytes == 0
    assert rows["transformer.wte.weight"].bytes == model.transformer.wte.weight.nbytes
    assert sum(r.bytes for r in rows.values()) == sum(
        p.nbytes for p in {id(p): p for p in model.parameters()}.values())


def test_counts_share_tied_weights_once():
    model = tiny_gpt2(torch.float16)
    assert count_params(model) == (TINY_PARAMS, TINY_PARAMS)
    assert unique_param_bytes(model) == 2 * TINY_PARAMS
    model.transformer.wpe.weight.requires_grad_(False)
    assert count_params(model) == (TINY_PARAMS, TINY_PARAMS - 128 * 64)


def test_footprint_counts_buffers_on_a_plain_module():
    norm = nn.BatchNorm1d(10)
    # weight + bias (fp32) + running_mean + running_var (fp32) + num_batches_tracked (int64)
    assert footprint_bytes(norm) == 4 * 10 * 4 + 8


def test_module_tree_preorder_depths_and_sums():
    model = tiny_gpt2()
    tree = module_tree(model)
    root = tree[0]
    assert (root.name, root.type, root.depth) == ("", "GPT2LMHeadModel", 0)
    assert root.params == TINY_PARAMS
    assert root.bytes == 4 * TINY_PARAMS
    by_name = {row.name: row for row in tree}
    block = by_name["transformer.h.0"]
    assert block.depth == 3 and block.params == 128 + 12480 + 4160 + 128 + 16640 + 16448
    names = [row.name for row in tree]
    assert names.index("transformer.h.0") < names.index("transformer.h.0.attn.c_attn")
    assert not any(row.quantized for row in tree)
    shallow = module_tree(model, max_depth=2)
    assert max(row.depth for row in shallow) == 2
    assert "transformer.h.0" not in {row.name for row in shallow}


def test_gpt2_footprint_at_fp32_and_fp16():
    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config())
    assert count_params(model) == (124_439_808, 124_439_808)
    assert footprint_bytes(model) == model.get_memory_footprint()
    assert round(footprint_bytes(model) / MIB, 2) == 474.70
    model = model.to(torch.float16)
    assert round(footprint_bytes(model) / MIB, 2) == 237.35
    tied = [(row.name, row.tied_to) for row in dtype_map(model) if row.tied_to]
    assert tied == [("lm_head.weight", "transformer.wte.weight")]


def test_gpt2_int8_keeps_small_tensors_fp16(tmp_path):
    base = GPT2LMHeadModel(GPT2Config()).to(torch.float16)
    model = load_quantized(tmp_path, base, BitsAndBytesConfig(load_in_8bit=True), torch.float16)
    assert footprint_bytes(model) == model.get_memory_footprint()
    assert round(footprint_bytes(model) / MIB, 2) == 156.35
    assert count_params(model)[0] == 124_439_808
    quantized_names = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                       "mlp.c_proj.weight")
    rows = dtype_map(model)
    for row in rows:
        if row.name.endswith(quantized_names):
            assert (row.dtype, row.module_type, row.bytes) == ("int8", "Linear8bitLt", row.numel)
        else:
            assert row.dtype == "float16", row.name
    assert sum(row.name.endswith(quantized_names) for row in rows) == 4 * 12
    tree = {row.name: row for row in module_tree(model)}
    assert tree["transformer.h.0.attn.c_attn"].quantized
    assert tree["transformer.h.0"].quantized and tree[""].quantized
    assert not tree["transformer.wte"].quantized and not tree["transformer.h.0.ln_1"].quantized


def test_nf4_counts_logical_weights_and_packed_bytes(tmp_path):
    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                bnb_4bit_compute_dtype=torch.bfloat16)
    model = load_quantized(tmp_path, tiny_gpt2(torch.bfloat16), config, torch.bfloat16)
    assert count_params(model)[0] == TINY_PARAMS
    rows = {row.name: row for row in dtype_map(model)}
    attn = rows["transformer.h.0.attn.c_attn.weight"]
    assert attn.module_type == "Linear4bit"
    assert attn.numel == 64 * 192 and attn.bytes == 64 * 192 // 2 and attn.dtype == "uint8"
    matrices = 2 * (64 * 192 + 64 * 64 + 64 * 256 + 256 * 64)
    assert count_quantized_params(model) == matrices
    assert footprint_bytes(model) == model.get_memory_footprint()


def test_lora_wrappers_are_named_by_tuner():
    model = get_peft_model(
        tiny_gpt2(), LoraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True)
    )
    tree = {row.name: row for row in module_tree(model)}
    assert tree["base_model.model.transformer.h.0.attn.c_attn"].type == "lora.Linear"
    # LoRA on c_attn (64 -> 192), rank 4, two layers: A is 4x64, B is 192x4.
    lora = 2 * 4 * (64 + 192)
    assert count_params(model) == (TINY_PARAMS + lora, lora)
    rows = {row.name: row for row in dtype_map(model)}
    base = rows["base_model.model.transformer.h.0.attn.c_attn.base_layer.weight"]
    assert base.module_type == "Conv1D" and not base.trainable


@pytest.mark.parametrize("depth", [0, 1])
def test_module_tree_depth_limit(depth):
    assert {row.depth for row in module_tree(tiny_gpt2(), max_depth=depth)} == set(
        range(depth + 1)
    )
