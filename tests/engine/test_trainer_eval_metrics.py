"""The Trainer's evaluation metrics reach the journal as the Trainer logs them (issue #32):
a real Trainer evaluating every 2 steps inside train()."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import ampscope
from engine.record.journal import read_journal
from tests.engine.test_trainer_callback import Collator, dataset


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """A Trainer sets accelerate's process-wide state: later tests in this process (an
    Accelerator with its own mixed precision) need it gone."""
    yield
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)


def test_eval_loss_and_the_other_metrics_are_journaled_at_their_step(tmp_path):
    journal = tmp_path / "eval.jsonl"
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=96,
                                       n_positions=32, bos_token_id=0, eos_token_id=0,
                                       attn_implementation="eager"))
    args = TrainingArguments(
        output_dir=str(tmp_path / "trainer"), per_device_train_batch_size=2, max_steps=4,
        logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
        remove_unused_columns=False, dataloader_num_workers=0, seed=0, disable_tqdm=True,
        eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=2)
    trainer = Trainer(model=model, args=args, train_dataset=dataset(),
                      eval_dataset=dataset()[:4], data_collator=Collator(),
                      callbacks=[ampscope.AmpScopeCallback(journal=journal)])
    trainer.train()
    logged = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert [h["step"] for h in logged] == [2, 4]
    record = read_journal(journal)
    by_name = {}
    for scalar in record.scalars:
        by_name.setdefault(scalar.name, []).append(scalar)
    # the step each evaluation followed: the Trainer's global step 2 is AmpScope's step 1
    assert [x.step for x in by_name["eval_loss"]] == [1, 3]
    assert [x.value for x in by_name["eval_loss"]] == pytest.approx(
        [h["eval_loss"] for h in logged], rel=1e-12)
    assert [x.value for x in by_name["eval_runtime"]] == pytest.approx(
        [h["eval_runtime"] for h in logged])
    assert "epoch" not in by_name
    # an evaluate() after train() returned has no run to go to: nothing is added
    trainer.evaluate()
    assert len(read_journal(journal).scalars) == len(record.scalars)
