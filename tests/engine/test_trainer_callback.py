"""ampscope.AmpScopeCallback inside a real transformers Trainer on the CPU."""

import copy
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import ampscope
from engine.record.journal import read_journal
from engine.record.json_report import read_json

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
        assert ("autocast bfloat16" if bf16 else "no autocast") in trial.recipe
        assert "optim=adamw_torch" in trial.recipe
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


# --- every ending of trainer.train() ends the run (issue #21) ----------------------------

ROOT = Path(__file__).resolve().parents[2]


def tiny_trainer(tmp_path, callback, collator=None, **overrides):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=96,
                                       n_positions=32, bos_token_id=0, eos_token_id=0,
                                       attn_implementation="eager"))
    args = TrainingArguments(
        output_dir=str(tmp_path / "trainer"), per_device_train_batch_size=2, max_steps=4,
        logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
        remove_unused_columns=False, dataloader_num_workers=0, seed=0, disable_tqdm=True,
        **overrides)
    return Trainer(model=model, args=args, train_dataset=dataset(),
                   data_collator=collator or Collator(), callbacks=[callback])


def no_monitor_left():
    return not any(t.name == "ampscope-monitor" and t.is_alive() for t in threading.enumerate())


@pytest.mark.parametrize("fail_at", [0, 1], ids=["warm-up step", "counting step"])
def test_trainer_raising_in_a_step_ends_the_run(tmp_path, fail_at):
    callback = ampscope.AmpScopeCallback(out=tmp_path / "r.json", journal=tmp_path / "r.jsonl")
    trainer = tiny_trainer(tmp_path, callback)
    forwards = []

    def broken(module, args, kwargs):
        if module.training:
            forwards.append(1)
            if len(forwards) == fail_at + 1:
                raise RuntimeError("forward broke")

    trainer.model.register_forward_pre_hook(broken, with_kwargs=True)
    with pytest.raises(RuntimeError, match="^forward broke$"):
        trainer.train()
    assert torch._C._len_torch_dispatch_stack() == 0  # FlopCounterMode was popped
    assert no_monitor_left()
    lines = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert lines[-1]["e"] == "end" and lines[-1]["status"] == "error"
    for record in (read_journal(tmp_path / "r.jsonl"), read_json(tmp_path / "r.json")):
        (trial,) = record.trials
        assert trial.status == "error" and "forward broke" in trial.reason
        assert [s.step for s in trial.steps] == list(range(fail_at))
    # the Trainer instance is as it was: the wrapped methods are the class's again
    assert "training_step" not in vars(trainer)


def test_ctrl_c_while_loading_data_ends_the_run_as_cancelled(tmp_path):
    class InterruptedCollator(Collator):
        def __call__(self, rows):
            if len(self.batches) == 2:
                raise KeyboardInterrupt
            return super().__call__(rows)

    callback = ampscope.AmpScopeCallback(journal=tmp_path / "k.jsonl")
    trainer = tiny_trainer(tmp_path, callback, InterruptedCollator())
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert no_monitor_left()
    record = read_journal(tmp_path / "k.jsonl")
    assert record.status == "cancelled"
    (trial,) = record.trials
    # the steps the Trainer finished before the interrupt (its loader reads one batch ahead)
    assert trial.status == "cancelled" and len(trial.steps) == trainer.state.global_step >= 1


FAILING_OPTIMIZER = textwrap.dedent("""
    import sys, torch
    from tests.engine.test_trainer_callback import tiny_trainer
    import ampscope
    from pathlib import Path

    class BrokenSGD(torch.optim.SGD):
        calls = 0

        def step(self, closure=None):
            BrokenSGD.calls += 1
            if BrokenSGD.calls == 3:
                raise ValueError("optimizer broke")
            return super().step(closure)

    callback = ampscope.AmpScopeCallback(journal=sys.argv[1])
    trainer = tiny_trainer(Path(sys.argv[2]), callback)
    trainer.optimizer = BrokenSGD(trainer.model.parameters(), lr=1e-2)
    trainer.train()
""")


def test_failure_outside_the_wrapped_methods_is_ended_at_exit(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(FAILING_OPTIMIZER)
    journal = tmp_path / "o.jsonl"
    proc = subprocess.run([sys.executable, str(script), str(journal), str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1 and "optimizer broke" in proc.stderr
    record = read_journal(journal)
    assert record.status == "error"
    (trial,) = record.trials
    assert "optimizer broke" in trial.reason and len(trial.steps) == 2


def test_gradient_accumulation_counts_every_micro_batch_of_the_counting_step(tmp_path):
    callback = ampscope.AmpScopeCallback(journal=tmp_path / "ga.jsonl")
    collator = Collator()
    trainer = tiny_trainer(tmp_path, callback, collator, gradient_accumulation_steps=2,
                           max_grad_norm=0.5)
    initial = copy.deepcopy(trainer.model)
    trainer.train()
    (trial,) = read_journal(tmp_path / "ga.jsonl").trials
    # step 1 trained on the third and fourth batches the collator made
    counter = FlopCounterMode(display=False)
    with counter:
        for batch in collator.batches[2:4]:
            initial(**batch).loss.backward()
    assert trial.flops.counted_per_step == counter.get_total_flops()
    assert torch._C._len_torch_dispatch_stack() == 0
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [s.grad_norm for s in trial.steps] == pytest.approx([h["grad_norm"] for h in logs],
                                                               rel=1e-6)
    assert [s.learning_rate for s in trial.steps] == pytest.approx(
        [h["learning_rate"] for h in logs])
