"""The recipe of a Trainer run names the adapter the model trains: LoRA or DoRA (#45).

peft's DoRA is a LoraConfig with ``use_dora=True``; the run found with
``benchmarks/real_clients.py`` on peft's dora_finetuning.py was described as
"PeftType.LORA". The expected text is built here from the config the test made.
"""

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainingArguments,
)

import ampscope
from engine.record.journal import read_journal
from tests.engine.test_trainer_callback import Collator, dataset


def gpt2():
    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=96,
                                      n_positions=32, bos_token_id=0, eos_token_id=0))


def llama():
    return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=2, vocab_size=96,
                                        max_position_embeddings=32))


@pytest.mark.parametrize("family, targets, use_dora", [
    (gpt2, ["c_attn", "c_fc"], False), (llama, ["q_proj", "v_proj", "down_proj"], True),
    (gpt2, ["c_attn"], True)], ids=["gpt2-lora", "llama-dora", "gpt2-dora"])
def test_recipe_names_lora_or_dora(tmp_path, family, targets, use_dora):
    torch.manual_seed(0)
    model = get_peft_model(family(), LoraConfig(r=4, target_modules=targets, use_dora=use_dora,
                                                fan_in_fan_out=family is gpt2))
    args = TrainingArguments(
        output_dir=str(tmp_path / "t"), per_device_train_batch_size=2, max_steps=2,
        save_strategy="no", report_to=[], use_cpu=True, remove_unused_columns=False,
        disable_tqdm=True, seed=0)
    Trainer(model=model, args=args, train_dataset=dataset(), data_collator=Collator(),
            callbacks=[ampscope.AmpScopeCallback(journal=tmp_path / "a.jsonl")]).train()
    (trial,) = read_journal(tmp_path / "a.jsonl").trials
    expected = f"LoRA default: {'DoRA' if use_dora else 'LoRA'} r=4 on {','.join(sorted(targets))}"
    assert expected in trial.recipe
    assert "PeftType" not in trial.recipe
