"""ampscope.AmpScopeCallback inside a real transformers Trainer on the CPU."""

import copy

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import ampscope
from engine.journal import read_journal
from engine.report.json_io import read_json

LENGTHS = [12, 5, 9, 3, 12, 7, 4, 10]  # padded to the longest in each batch of 2


def dataset():
    g = torch.Generator().manual_seed(1)
    return [{"input_ids": torch.randint(1, 96, (n,), generator=g)} for n in LENGTHS]


class Collator:
    """Pads a batch (mask 0, label -100) and keeps what it produced, in order."""

    def __init__(self):
        self.batches = []

    def __call__(self, rows):
        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, :len(r["input_ids"])] = r["input_ids"]
            mask[i, :len(r["input_ids"])] = 1
        batch = {"input_ids": ids, "attention_mask": mask,
                 "labels": ids.masked_fill(mask == 0, -100)}
        self.batches.append({k: v.clone() for k, v in batch.items()})
        return batch


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_trainer_steps_match_the_trainers_own_log(tmp_path, bf16):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=96,
                                       n_positions=32, bos_token_id=0, eos_token_id=0,
                                       attn_implementation="eager"))
    initial = copy.deepcopy(model)
    collator = Collator()
    args = TrainingArguments(
        output_dir=str(tmp_path / "trainer"), per_device_train_batch_size=2, max_steps=4,
        logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, bf16=bf16,
        remove_unused_columns=False, learning_rate=1e-3, lr_scheduler_type="linear",
        dataloader_num_workers=0, seed=0, disable_tqdm=True,
    )
    callback = ampscope.AmpScopeCallback(out=tmp_path / "run.json", journal=tmp_path / "run.jsonl")
    trainer = Trainer(model=model, args=args, train_dataset=dataset(), data_collator=collator,
                      callbacks=[callback])
    trainer.train()

    logs = [h for h in trainer.state.log_history if "loss" in h]
    journal = read_journal(tmp_path / "run.jsonl")
    report = read_json(tmp_path / "run.json")
    for record in (journal, report):
        (trial,) = record.trials
        assert record.status == "ok" and trial.status == "ok"
        assert trial.source == "user-trainer"
        assert trial.precision == ("bf16-amp" if bf16 else "fp32")
        assert ("bf16 autocast" if bf16 else "no autocast") in trial.recipe
        assert "optimizer adamw_torch" in trial.recipe
        steps = trial.steps
        assert len(steps) == trainer.state.global_step == 4
        assert [s.step for s in steps] == [0, 1, 2, 3]
        assert [s.loss for s in steps] == pytest.approx([h["loss"] for h in logs], rel=1e-6)
        assert [s.grad_norm for s in steps] == pytest.approx([h["grad_norm"] for h in logs],
                                                             rel=1e-6)
        assert [s.learning_rate for s in steps] == pytest.approx(
            [h["learning_rate"] for h in logs])
        # tokens: the real (unpadded) tokens of the batch each step trained on
        trained = collator.batches[:4]
        assert [s.tokens for s in steps] == [int(b["attention_mask"].sum()) for b in trained]
        assert [s.tokens for s in steps] != [b["input_ids"].numel() for b in trained]
    # hardware FLOPs of the counting step (step 1): FlopCounterMode over its batch, here
    counter = FlopCounterMode(display=False)
    with counter:
        initial(**collator.batches[1]).loss.backward()
    assert journal.trials[0].flops.counted_per_step == counter.get_total_flops()
