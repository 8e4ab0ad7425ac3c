"""A Trainer's step timed whole (issue #45): the batch fetch, the evaluation and the
checkpoint save inside the step that triggered them, every parameter group's lr, and the
precision that ran, on a real transformers Trainer with a slow collator."""

import statistics
import time

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

import ampscope
from engine.record.journal import read_journal
from tests.engine.test_trainer_callback import Collator, dataset

SLEEP_S = 0.04  # the collator's own time per batch: a tokenizer, a slow disk
STEPS = 8
BASE_LR = 1e-3


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """A Trainer sets accelerate's process-wide state; later tests need it gone."""
    yield
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)


def gpt2():
    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=96,
                                      n_positions=32, bos_token_id=0, eos_token_id=0,
                                      attn_implementation="eager"))


def llama():
    return LlamaForCausalLM(LlamaConfig(num_hidden_layers=1, hidden_size=32,
                                        intermediate_size=64, num_attention_heads=2,
                                        num_key_value_heads=2, vocab_size=96,
                                        max_position_embeddings=32,
                                        attn_implementation="eager"))


class SlowCollator(Collator):
    """Sleeps per batch."""

    def __call__(self, rows):
        time.sleep(SLEEP_S)
        return super().__call__(rows)


def train(tmp_path, build, accumulation=1, **overrides):
    torch.manual_seed(0)
    model = build()
    params = list(model.parameters())
    half = len(params) // 2
    optimizer = torch.optim.AdamW([{"params": params[:half]},
                                   {"params": params[half:], "lr": BASE_LR / 2}], lr=BASE_LR)
    collator = SlowCollator()
    settings = dict(eval_strategy="steps", eval_steps=4, save_strategy="steps", save_steps=4)
    args = TrainingArguments(
        output_dir=str(tmp_path / "trainer"), per_device_train_batch_size=1,
        gradient_accumulation_steps=accumulation, max_steps=STEPS, logging_steps=1,
        per_device_eval_batch_size=2, report_to=[], use_cpu=True,
        remove_unused_columns=False, dataloader_num_workers=0, seed=0, disable_tqdm=True,
        lr_scheduler_type="linear", **{**settings, **overrides})
    journal = tmp_path / "run.jsonl"
    trainer = Trainer(model=model, args=args, train_dataset=dataset() * 2,
                      eval_dataset=dataset()[:4], data_collator=collator,
                      optimizers=(optimizer, None),
                      callbacks=[ampscope.AmpScopeCallback(journal=journal)])
    trainer.step_begins = []
    trainer.add_callback(StepBegins(trainer.step_begins))
    trainer.train()
    return trainer, collator, read_journal(journal)


class StepBegins(TrainerCallback):
    def __init__(self, times):
        self.times = times

    def on_step_begin(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter())


@pytest.mark.parametrize("build", [gpt2, llama])
def test_data_evaluation_and_saves_are_inside_the_step(tmp_path, build):
    trainer, collator, record = train(tmp_path, build)
    (trial,) = record.trials
    steps = trial.steps
    assert len(steps) == STEPS
    # the batch fetch is the step's data time, inside step_ms
    assert statistics.median(s.data_ms for s in steps) >= 0.75 * SLEEP_S * 1e3
    for s in steps:
        parts = [s.data_ms, s.forward_ms, s.backward_ms, s.optimizer_ms, s.eval_ms or 0.0,
                 s.save_ms or 0.0]
        assert s.data_ms <= s.step_ms
        assert sum(parts) == pytest.approx(s.step_ms, rel=1e-6)
    # a measured step is the user's wall time per step: from one on_step_begin to the
    # next, as a plain callback sees it (the warm-up step also fetched the batch accelerate
    # keeps one ahead; the counting step's cycle also has AmpScope's memory analysis)
    begins = trainer.step_begins
    assert len(begins) == STEPS
    # (summed: one step's fetch is another's jitter on a loaded host); what is left out is
    # AmpScope's own recording between two steps, as the Recorder leaves it out
    measured = sum(s.step_ms for s in steps[2:STEPS - 1])
    cycles = (begins[STEPS - 1] - begins[2]) * 1e3
    assert 0.85 * cycles <= measured <= 1.02 * cycles
    # evaluation every 4 Trainer steps (global steps 4 and 8: AmpScope's 3 and 7), inside
    evals = [h for h in trainer.state.log_history if "eval_runtime" in h]
    assert [h["step"] for h in evals] == [4, 8]
    evaluated = {s.step: s.eval_ms for s in steps if s.eval_ms}
    assert sorted(evaluated) == [3, 7]
    for h in evals:
        assert evaluated[h["step"] - 1] >= 0.5 * h["eval_runtime"] * 1e3
        assert evaluated[h["step"] - 1] >= 2 * SLEEP_S * 1e3  # its two batches' collation
    # the checkpoint saves of the same steps, as their own phase
    assert (tmp_path / "trainer" / "checkpoint-4").is_dir()
    assert sorted(s.step for s in steps if s.save_ms) == [3, 7]
    # eval metrics at the step each evaluation followed
    eval_losses = [(x.step, x.value) for x in record.scalars if x.name == "eval_loss"]
    assert eval_losses == pytest.approx([(h["step"] - 1, h["eval_loss"]) for h in evals])
    assert "checkpoint saves (in 2 steps)" in " ".join(trial.notes)


def test_an_evaluation_at_the_epochs_end_is_in_the_last_step_it_followed(tmp_path):
    """eval_strategy="epoch": the Trainer evaluates after on_epoch_end, once the last
    step's own log is done: its time is added to that step, its metrics journaled there."""
    trainer, _, record = train(tmp_path, gpt2, eval_strategy="epoch", save_strategy="no")
    steps = record.trials[0].steps
    (evaluation,) = [h for h in trainer.state.log_history if "eval_runtime" in h]
    assert evaluation["step"] == STEPS
    assert [s.step for s in steps if s.eval_ms] == [STEPS - 1]
    assert steps[-1].eval_ms >= 0.5 * evaluation["eval_runtime"] * 1e3
    last = steps[-1]
    assert sum([last.data_ms, last.forward_ms, last.backward_ms, last.optimizer_ms,
                last.eval_ms]) == pytest.approx(last.step_ms, rel=1e-6)
    assert [(x.step, x.value) for x in record.scalars if x.name == "eval_loss"] == \
        pytest.approx([(STEPS - 1, evaluation["eval_loss"])])


@pytest.mark.parametrize("build", [gpt2, llama])
def test_every_parameter_groups_lr_on_every_step(tmp_path, build):
    trainer, _, record = train(tmp_path, build)
    steps = record.trials[0].steps
    logged = [h["learning_rate"] for h in trainer.state.log_history if "loss" in h]
    # the linear schedule with no warm-up, computed here: lr_k = base * (1 - k / STEPS)
    expected = [BASE_LR * (1 - k / STEPS) for k in range(STEPS)]
    assert [s.learning_rate for s in steps] == pytest.approx(expected)
    assert logged == pytest.approx(expected)
    group1 = {x.step: x.value for x in record.scalars if x.name == "lr_group1"}
    assert group1 == pytest.approx({k: lr / 2 for k, lr in enumerate(expected)})


def test_every_micro_batchs_fetch_is_data_under_gradient_accumulation(tmp_path):
    _, _, record = train(tmp_path, gpt2, accumulation=2)
    steps = record.trials[0].steps
    assert len(steps) == STEPS
    # the Trainer fetches both micro-batches before the step's first forward
    assert statistics.median(s.data_ms for s in steps) >= 2 * 0.75 * SLEEP_S * 1e3
    for s in steps:
        assert s.forward_ms > 0 and s.backward_ms > 0


@pytest.mark.parametrize("asked", ["fp16", "bf16"])
def test_the_precision_is_what_ran_and_the_notes_say_what_was_asked(tmp_path, asked):
    """dora_finetuning.py ships fp16=True: on a CPU accelerate keeps native AMP off and
    makes no GradScaler, so fp32 ran; bf16=True runs bf16 autocast on a CPU."""
    trainer, _, record = train(tmp_path, gpt2, **{asked: True})
    (trial,) = record.trials
    accelerator = trainer.accelerator
    ran_amp = accelerator.native_amp  # what accelerate did, read here
    assert getattr(accelerator, "scaler", None) is None
    by_dtype = trial.flops.by_peak_dtype  # the counting step's FLOPs by dtype
    top = max(by_dtype, key=by_dtype.get)
    if asked == "fp16":
        assert not ran_amp and top == "fp32"
        assert trial.precision == "fp32"
        assert "no autocast, no loss scaling" in trial.recipe
        (note,) = [n for n in trial.notes if n.startswith("TrainingArguments(fp16=True)")]
        assert "asked for fp16-amp" in note and "but fp32 ran" in note
    else:
        assert ran_amp and top == "bf16"
        assert trial.precision == "bf16-amp"
        assert "autocast bfloat16, no loss scaling" in trial.recipe
        assert not any(n.startswith("TrainingArguments(") for n in trial.notes)
