import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from engine.models.load import (
    SUPPORTED_LINE,
    conv1d_to_linear,
    dims,
    load_model,
    make_batches,
    resolve_source,
)
from engine.models.presets import get_preset, param_count, presets
from tests.engine.families import FAMILIES

MIB = 2**20


def test_presets_cover_the_product_list_with_exact_counts():
    names = {p.name for p in presets()}
    assert {"tiny", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "llama-1b",
            "bert-base"} <= names
    assert param_count("gpt2") == 124_439_808
    assert get_preset("bert-base").task == "masked-lm"
    assert 1.0e9 < param_count("llama-1b") < 1.2e9  # TinyLlama-1.1B's shape


@pytest.mark.parametrize(("precision", "mib"), [("fp32", 474.70), ("fp16", 237.35),
                                                ("int8", 156.35)])
def test_gpt2_load_footprint_matches_transformers(precision, mib):
    loaded = load_model("gpt2", precision, "cpu", train=False)
    assert round(loaded.footprint_bytes / MIB, 2) == mib
    assert loaded.footprint_bytes == loaded.model.get_memory_footprint()
    assert "12.00 MiB" in loaded.footprint_note  # why older releases printed 486.70


def test_int8_training_model_has_lora_adapters_only_trainable():
    loaded = load_model("tiny", "int8", "cpu", lora_r=4)
    named = list(loaded.model.named_parameters())
    trainable = [n for n, p in named if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    kinds = {type(m).__name__ for m in loaded.model.modules()}
    assert "Linear8bitLt" in kinds
    # the whole LoRA configuration is recorded; peft's own count agrees with ours
    lora = loaded.lora
    assert (lora["r"], lora["alpha"], lora["dropout"]) == (4, 8, 0.0)
    assert lora["target_modules"] == ["c_attn", "c_fc", "c_proj"]  # GPT-2's quantised layers
    ours = sum(p.numel() for n, p in named if p.requires_grad)
    assert lora["peft_trainable_params"] == ours
    # tiny: 2 layers of c_attn 128->384, attn c_proj 128->128, c_fc 128->512, c_proj 512->128
    assert ours == 2 * 4 * ((128 + 384) + (128 + 128) + (128 + 512) + (512 + 128))


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_encoder_decoders_load_both_stacks_and_train(tmp_path, family):
    from transformers import AutoModelForSeq2SeqLM

    config = FAMILIES[family]()
    config.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), "fp32", "cpu")
    assert loaded.task == "seq2seq-lm"
    reference = AutoModelForSeq2SeqLM.from_config(config)  # not the decoder-only CausalLM
    count = sum(p.numel() for p in loaded.model.parameters())
    assert count == sum(p.numel() for p in reference.parameters())
    d = dims(loaded.config)
    assert (d["encoder_layers"], d["decoder_layers"], d["n_layers"]) == (2, 2, 4)
    batch = make_batches(loaded.config, loaded.task, 2, 8, 1, 0, "cpu")[0]
    assert batch["decoder_input_ids"].shape == (2, 8)
    assert torch.equal(batch["decoder_input_ids"][:, 1:], batch["labels"][:, :-1])
    loss = loaded.model(**batch).loss
    loss.backward()
    assert torch.isfinite(loss)


def test_architecture_without_a_training_head_is_one_line(tmp_path):
    from transformers import CLIPVisionConfig

    CLIPVisionConfig(hidden_size=32, num_attention_heads=2, num_hidden_layers=1).save_pretrained(
        tmp_path)
    with pytest.raises(ValueError) as info:
        load_model(str(tmp_path), "fp32", "cpu")
    message = str(info.value)
    assert "\n" not in message and SUPPORTED_LINE in message and "clip_vision" in message


def _tiny_gpt2():
    torch.manual_seed(1)
    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64,
                                      n_positions=32))


def test_folder_with_weights_loads_those_weights(tmp_path):
    saved = _tiny_gpt2()
    saved.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), "fp32", "cpu", train=False)
    assert loaded.source.kind == "folder"
    for (name, a), b in zip(saved.state_dict().items(), loaded.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_folder_with_config_only_builds_random_weights(tmp_path):
    _tiny_gpt2().config.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), "bf16", "cpu", train=False)
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}


def test_folder_int8_quantises_while_loading(tmp_path):
    _tiny_gpt2().save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), "int8", "cpu", train=False)
    assert any(p.dtype == torch.int8 for p in loaded.model.parameters())


def test_bad_sources_say_what_to_do(tmp_path, hub_offline):
    with pytest.raises(ValueError, match="does not exist"):
        resolve_source(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        resolve_source(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="hf download someone/not-cached"):
        load_model("someone/not-cached", "fp32", "cpu")
    assert resolve_source("gpt2").kind == "preset"


def test_batches_are_identical_for_every_call_and_masked_lm_has_targets():
    config = get_preset("tiny").build_config()
    a = make_batches(config, "causal-lm", 2, 8, 3, seed=5, device="cpu")
    b = make_batches(config, "causal-lm", 2, 8, 3, seed=5, device="cpu")
    assert all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, b))
    assert torch.equal(a[0]["labels"], a[0]["input_ids"])
    bert = get_preset("bert-base").build_config()
    masked = make_batches(bert, "masked-lm", 2, 16, 1, seed=0, device="cpu")[0]
    assert ((masked["labels"] != -100).sum(dim=1) >= 1).all()


def test_conv1d_to_linear_keeps_the_math():
    model = _tiny_gpt2().eval()
    ids = torch.randint(0, 64, (2, 8))
    before = model(input_ids=ids).logits
    assert conv1d_to_linear(model) == 4  # c_attn, c_proj, c_fc, mlp c_proj
    after = model(input_ids=ids).logits
    assert torch.allclose(before, after, atol=1e-5)
