"""A user's loop trains bit for bit the same with ampscope.Recorder attached as without.

The Recorder counts FLOPs and watches memory over the loop's second step (engine.measure
.flops, .memtrack), and times every step; none of it may change which kernels run, the
order gradients are summed in, or the RNG. Each recipe a loop can run, on GPT-2 (biases,
dropout, clipping, widths of 96) and a Mistral-style model: the same seeded loop twice,
compared by every step's loss and the trainable weights at the end.
"""

import pytest
import torch
import transformers as tf
from peft import LoraConfig, get_peft_model

import ampscope

STEPS = 6
FAMILIES = {
    "gpt2": lambda: tf.GPT2Config(n_embd=96, n_layer=2, n_head=6, n_inner=200, vocab_size=700,
                                  n_positions=64, resid_pdrop=0.1, embd_pdrop=0.1,
                                  attn_pdrop=0.1),
    "mistral": lambda: tf.MistralConfig(hidden_size=96, intermediate_size=200,
                                        num_hidden_layers=2, num_attention_heads=6,
                                        num_key_value_heads=2, vocab_size=700,
                                        max_position_embeddings=64),
}
# recipe: (weights' dtype, autocast dtype, GradScaler, bitsandbytes quantisation)
RECIPES = {
    "fp32": (torch.float32, None, False, None),
    "bf16-amp": (torch.float32, torch.bfloat16, False, None),
    "fp16-amp": (torch.float32, torch.float16, True, None),
    "bf16": (torch.bfloat16, None, False, None),
    "nf4": (torch.float32, None, False, tf.BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)),
    "int8": (torch.float32, None, False, tf.BitsAndBytesConfig(load_in_8bit=True)),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    out = {}
    for family, config in FAMILIES.items():
        torch.manual_seed(0)
        folder = tmp_path_factory.mktemp(family)
        tf.AutoModelForCausalLM.from_config(config()).save_pretrained(folder)
        out[family] = folder
    return out


def _model(folder, precision):
    dtype, _, _, quant = RECIPES[precision]
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype,
                                                    quantization_config=quant)
    if quant is not None:  # QLoRA / LoRA on 8-bit: adapters on every linear layer
        model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear"))
    return model


def _loop(folder, precision, journal=None):
    """The loop as a user writes it: forward (autocast), scaled backward, clipping, step."""
    _, autocast, scaled, _ = RECIPES[precision]
    model = _model(folder, precision)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", enabled=scaled)
    gen = torch.Generator().manual_seed(1)
    losses = []
    rec = ampscope.Recorder(model, opt, scaler, journal=journal) if journal else None
    with rec if rec else torch.enable_grad():
        for _ in range(STEPS):
            ids = torch.randint(0, 700, (2, 16), generator=gen)
            with torch.autocast("cpu", dtype=autocast or torch.bfloat16,
                                enabled=autocast is not None):
                loss = model(input_ids=ids, labels=ids).loss
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
            if rec:
                rec.step(loss=loss)
    return losses, [p.detach().clone() for p in params], torch.get_rng_state()


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("precision", list(RECIPES))
def test_the_recorder_leaves_the_loop_bit_identical(family, precision, folders, tmp_path):
    plain_losses, plain_params, plain_rng = _loop(folders[family], precision)
    losses, params, rng = _loop(folders[family], precision, tmp_path / "r.jsonl")
    assert losses == plain_losses
    assert all(torch.equal(a, b) for a, b in zip(params, plain_params, strict=True))
    assert torch.equal(rng, plain_rng)
    assert (tmp_path / "r.jsonl").stat().st_size > 0  # the Recorder did record


def _trainer(folder, bf16, out, tmp_path):
    """A real Trainer on the family's model; its losses and trained weights."""
    g = torch.Generator().manual_seed(1)
    rows = [{"input_ids": (ids := torch.randint(0, 700, (16,), generator=g)), "labels": ids}
            for _ in range(12)]
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_pretrained(folder)
    args = tf.TrainingArguments(
        output_dir=str(tmp_path / "trainer"), per_device_train_batch_size=2, max_steps=STEPS,
        logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, bf16=bf16,
        learning_rate=1e-3, max_grad_norm=1.0, seed=0, disable_tqdm=True,
        dataloader_num_workers=0)
    callbacks = [ampscope.AmpScopeCallback(journal=out)] if out else []
    trainer = tf.Trainer(model=model, args=args, train_dataset=rows, callbacks=callbacks)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return losses, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-amp"])
def test_the_trainer_callback_leaves_training_bit_identical(family, bf16, folders, tmp_path):
    plain_losses, plain_params = _trainer(folders[family], bf16, None, tmp_path)
    losses, params = _trainer(folders[family], bf16, tmp_path / "t.jsonl", tmp_path)
    assert len(losses) == STEPS and losses == plain_losses
    assert all(torch.equal(a, b) for a, b in zip(params, plain_params, strict=True))
    assert (tmp_path / "t.jsonl").stat().st_size > 0
