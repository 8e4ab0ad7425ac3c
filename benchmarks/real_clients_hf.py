"""The three Hugging Face clients of ``real_clients.py``, condensed from their scripts.

Each keeps its script's structure (data preparation, optimizer, loop or Trainer
arguments) and replaces only what needs a download: a word-level tokenizer built here
over the words ``w0``..``w95``, random texts for the dataset, a model from a tiny config.
Each returns the journal AmpScope wrote and the client's own values, read from the
client (its loop's variables, the Trainer's ``log_history``, its accelerator's state),
never from AmpScope:

- ``run_accelerate``: transformers ``examples/pytorch/language-modeling/
  run_clm_no_trainer.py``, its loop in the ``with accelerator.accumulate(model)`` form
  (as in AmpScope's README; the transformers clone, 1.3 GB, could not be fetched where
  this was written, and the copy read, at 3c354ea2, steps every
  ``gradient_accumulation_steps`` micro-batches by hand instead): tokenize,
  ``group_texts``, ``default_data_collator``, AdamW over the decay and no-decay groups,
  ``get_scheduler`` (linear, warm-up), ``Accelerator(gradient_accumulation_steps=2,
  mixed_precision="bf16")``, two epochs each ending in its evaluation (its mean eval
  loss is ``rec.log``ged). Tiny GPT-2. The Recorder as the README says (``rec.step``
  when ``sync_gradients``, last micro-batch's loss). The script clips nothing, so the
  client's norm is computed here by its definition before each optimizer step, with the
  lr of each group that step uses.
- ``run_trainer``: transformers' ``run_clm.py`` (at 0851a87d): tokenize, ``group_texts``
  (labels the inputs), the Trainer with ``processing_class=tokenizer``,
  ``default_data_collator``, its ``preprocess_logits_for_metrics`` (argmax) and
  ``compute_metrics`` (next-token accuracy, computed here as ``evaluate``'s accuracy
  would, without the package) and evaluation; here bf16, gradient
  accumulation 2, evaluation every 3 steps, ``max_grad_norm=0.05`` (so it clips), and
  ``include_num_input_tokens_seen="non_padding"`` for the Trainer's own token count.
  Tiny Llama. The lr of every group comes from a callback of the client's reading the
  optimizer at ``on_optimizer_step`` (before the scheduler steps).
- ``run_dora``: peft ``examples/dora_finetuning/dora_finetuning.py`` (at 5d602fdb) as
  shipped: DoRA (``use_dora=True``, r 8, alpha 16, dropout 0.05, its seven Llama target
  modules), ``padding="max_length"`` with the eos as pad, ``DataCollatorForLanguageModeling``,
  its ``TrainingArguments`` (``fp16=True``, gradient accumulation 16, 100 warm-up steps,
  weight decay 0.01, ``save_steps``, ``save_total_limit=2``), batch 1, one epoch of 64
  rows (4 steps), logging every step; ``include_num_input_tokens_seen="non_padding"``
  added. On the CPU accelerate keeps fp16 AMP off: fp32 ran, which is what the client's
  accelerator says.
"""

from __future__ import annotations

import math
from itertools import chain
from pathlib import Path

import torch

VOCAB = 96


def precision_label(weights: str, autocast: str | None, scaled: bool) -> str:
    """AmpScope's precision names (README "Recipes"), from what the client says ran."""
    if weights in ("float16", "bfloat16"):
        return {"float16": "fp16", "bfloat16": "bf16"}[weights]
    if autocast == "float16" or scaled:
        return "fp16-amp"
    return "bf16-amp" if autocast == "bfloat16" else "fp32"


def tiny_tokenizer():
    """A word-level tokenizer over w0..w95 (w0 unknown, w1 end of text), built here."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", eos_token="w1")


def random_texts(n: int, seed: int, longest: int = 40) -> list[str]:
    """Texts of 4..longest random words, none of them the eos (the dora client's pad)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, longest + 1, (n,), generator=g).tolist()
    return [" ".join(f"w{i}" for i in torch.randint(2, VOCAB, (k,), generator=g).tolist())
            for k in lengths]


def group_texts(rows: list[dict], block_size: int) -> list[dict]:
    """run_clm's group_texts: concatenate, cut into blocks, labels a copy of the inputs."""
    joined = {k: list(chain(*(r[k] for r in rows))) for k in rows[0]}
    total = len(joined["input_ids"]) // block_size * block_size
    blocks = [{k: v[i:i + block_size] for k, v in joined.items()}
              for i in range(0, total, block_size)]
    for b in blocks:
        b["labels"] = list(b["input_ids"])
    return blocks


def tokenized_blocks(tokenizer, n: int, seed: int, block_size: int) -> list[dict]:
    return group_texts([dict(tokenizer(t)) for t in random_texts(n, seed)], block_size)


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
        bos_token_id=1, eos_token_id=1))


def accelerator_label(accelerator) -> tuple[str, str | None, bool]:
    """(weights, autocast, scaled) as the client's accelerator holds them."""
    autocast = ({"bf16": "bfloat16", "fp16": "float16"}.get(str(accelerator.mixed_precision))
                if accelerator.native_amp else None)
    return "float32", autocast, getattr(accelerator, "scaler", None) is not None


def run_accelerate(work: Path) -> tuple[Path, dict]:
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from torch.utils.data import DataLoader
    from transformers import GPT2Config, GPT2LMHeadModel, default_data_collator, get_scheduler

    import ampscope
    accelerator = Accelerator(gradient_accumulation_steps=2, mixed_precision="bf16", cpu=True)
    set_seed(0)
    tokenizer = tiny_tokenizer()
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB,
                                       n_positions=64, bos_token_id=1, eos_token_id=1))
    train_dataset = tokenized_blocks(tokenizer, 40, seed=1, block_size=32)
    eval_dataset = tokenized_blocks(tokenizer, 8, seed=2, block_size=32)
    train_dataloader = DataLoader(train_dataset, shuffle=True, batch_size=2,
                                  collate_fn=default_data_collator)
    eval_dataloader = DataLoader(eval_dataset, batch_size=2, collate_fn=default_data_collator)
    no_decay = ["bias", "layer_norm.weight"]
    optimizer = torch.optim.AdamW([
        {"params": [p for n, p in model.named_parameters()
                    if not any(nd in n for nd in no_decay)], "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters()
                    if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ], lr=1e-3)
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / 2)
    epochs = 2
    max_train_steps = epochs * num_update_steps_per_epoch
    lr_scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=2,
                                 num_training_steps=max_train_steps)
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler)
    client = {"loss": [], "lr": [], "grad_norm": [], "tokens": [], "scalars": {"eval_loss": {}}}
    journal = work / "accelerate.jsonl"
    completed_steps, tokens = 0, 0
    with ampscope.Recorder(model, optimizer, journal=journal) as rec:
        for _epoch in range(epochs):
            model.train()
            for batch in train_dataloader:
                with accelerator.accumulate(model):
                    outputs = model(**batch)
                    loss = outputs.loss
                    tokens += int(batch["attention_mask"].sum())  # the client's count
                    accelerator.backward(loss)
                    if accelerator.sync_gradients:  # what this optimizer step uses
                        client["grad_norm"].append(math.sqrt(sum(
                            float((p.grad.double() ** 2).sum()) for p in model.parameters()
                            if p.grad is not None)))
                        client["lr"].append([g["lr"] for g in optimizer.param_groups])
                    optimizer.step()
                    lr_scheduler.step()
                    optimizer.zero_grad()
                if accelerator.sync_gradients:
                    completed_steps += 1
                    client["loss"].append(loss.item())
                    client["tokens"].append(tokens)
                    tokens = 0
                    rec.step(loss=loss)
            model.eval()
            losses = []
            for batch in eval_dataloader:
                with torch.no_grad():
                    outputs = model(**batch)
                losses.append(accelerator.gather_for_metrics(outputs.loss.repeat(2)))
            eval_loss = torch.mean(torch.cat(losses)).item()
            client["scalars"]["eval_loss"][completed_steps - 1] = eval_loss
            rec.log(eval_loss=eval_loss)
    client["precision"] = precision_label(*accelerator_label(accelerator))
    return journal, client


def trainer_client(trainer, lrs: list) -> dict:
    """The Trainer's own log: per-step loss and grad norm, token counts, evaluations."""
    history = trainer.state.log_history
    logs = [h for h in history if "loss" in h]
    seen = [0] + [h["num_input_tokens_seen"] for h in logs]
    # the Trainer's global step k is AmpScope's step k - 1 (counted from 0)
    evals = {name: {h["step"] - 1: h[name] for h in history if name in h}
             for name in ("eval_loss", "eval_accuracy")}
    return {
        "loss": [h["loss"] for h in logs],
        "lr": lrs,
        "grad_norm": [h["grad_norm"] for h in logs],
        "tokens": [b - a for a, b in zip(seen, seen[1:])],
        "lr_logged": [h["learning_rate"] for h in logs],
        "scalars": {name: at for name, at in evals.items() if at},
        "precision": precision_label(*accelerator_label(trainer.accelerator)),
    }


def lr_reader():
    """A client callback reading every group's lr after each optimizer step (before the
    scheduler's), the lr that step used."""
    from transformers import TrainerCallback

    class ReadLr(TrainerCallback):
        def __init__(self):
            self.lrs = []

        def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
            self.lrs.append([g["lr"] for g in optimizer.param_groups])

    return ReadLr()


def run_trainer(work: Path) -> tuple[Path, dict]:
    from transformers import Trainer, TrainingArguments, default_data_collator, set_seed

    import ampscope

    set_seed(0)
    tokenizer = tiny_tokenizer()
    model = tiny_llama()
    args = TrainingArguments(
        output_dir=str(work / "trainer"), per_device_train_batch_size=2,
        per_device_eval_batch_size=2, gradient_accumulation_steps=2, max_steps=6,
        logging_steps=1, eval_strategy="steps", eval_steps=3, save_strategy="no",
        use_cpu=True, bf16=True, learning_rate=1e-3, warmup_steps=2, max_grad_norm=0.05,
        include_num_input_tokens_seen="non_padding", report_to=[], disable_tqdm=True, seed=0)
    journal = work / "trainer.jsonl"
    reader = lr_reader()

    def preprocess_logits_for_metrics(logits, labels):
        return (logits[0] if isinstance(logits, tuple) else logits).argmax(dim=-1)

    def compute_metrics(eval_preds):
        preds, labels = eval_preds  # shifted: position i predicts token i + 1
        return {"accuracy": float((preds[:, :-1] == labels[:, 1:]).mean())}

    trainer = Trainer(
        model=model, args=args, train_dataset=tokenized_blocks(tokenizer, 60, 1, 32),
        eval_dataset=tokenized_blocks(tokenizer, 8, 2, 32), processing_class=tokenizer,
        data_collator=default_data_collator, compute_metrics=compute_metrics,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics,
        callbacks=[ampscope.AmpScopeCallback(journal=journal), reader])
    trainer.train()
    return journal, trainer_client(trainer, reader.lrs)


def run_dora(work: Path) -> tuple[Path, dict]:
    from peft import LoraConfig, get_peft_model
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments, set_seed

    import ampscope

    set_seed(0)
    tokenizer = tiny_tokenizer()
    model = tiny_llama()
    model = get_peft_model(model, LoraConfig(
        use_dora=True, r=8, lora_alpha=16, lora_dropout=0.05, bias="none",
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                        "down_proj"]))
    model.to("cpu")
    tokenizer.pad_token = tokenizer.eos_token

    def tokenize_function(text):
        inputs = dict(tokenizer(text, padding="max_length", truncation=True, max_length=32))
        inputs["labels"] = inputs["input_ids"].copy()
        return inputs

    args = TrainingArguments(
        output_dir=str(work / "dora"), num_train_epochs=1, per_device_train_batch_size=1,
        per_device_eval_batch_size=1, warmup_steps=100, weight_decay=0.01, logging_steps=1,
        save_steps=2, save_total_limit=2, gradient_accumulation_steps=16, fp16=True,
        learning_rate=3e-4, include_num_input_tokens_seen="non_padding", report_to=[],
        disable_tqdm=True, seed=0)
    journal = work / "dora.jsonl"
    reader = lr_reader()
    trainer = Trainer(
        model=model, args=args,
        train_dataset=[tokenize_function(t) for t in random_texts(64, 1)],
        eval_dataset=[tokenize_function(t) for t in random_texts(8, 2)],
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        callbacks=[ampscope.AmpScopeCallback(journal=journal), reader])
    trainer.train()
    return journal, trainer_client(trainer, reader.lrs)
