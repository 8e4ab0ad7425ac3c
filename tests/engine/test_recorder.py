"""ampscope.Recorder around hand-written loops: what it records, checked independently."""

import copy
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import ampscope
from ampscope.counting_step import COUNT_STEP
from engine.record.journal import read_journal
from engine.record.json_report import read_json

ROOT = Path(__file__).resolve().parents[2]


def tiny_gpt2():
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=96, n_positions=32,
                        bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    return GPT2LMHeadModel(config)


def tiny_llama():
    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                         num_attention_heads=2, num_key_value_heads=2, vocab_size=96,
                         max_position_embeddings=32, attn_implementation="eager")
    return LlamaForCausalLM(config)


def padded_batch(seed: int, lengths=(12, 7, 4)):
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(1, 96, (len(lengths), width), generator=g)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@pytest.mark.parametrize("build", [tiny_gpt2, tiny_llama])
def test_loop_records_losses_tokens_and_flops(tmp_path, build):
    model = build()
    reference = copy.deepcopy(model)
    batches = [padded_batch(i) for i in range(4)]
    # hardware FLOPs of the counting step (step 1), counted here without AmpScope
    counter = FlopCounterMode(display=False)
    with counter:
        reference(**batches[1]).loss.backward()
    expected_flops = counter.get_total_flops()

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    with ampscope.Recorder(model, opt, out=tmp_path / "run.json", name="mine",
                           journal=tmp_path / "run.jsonl") as rec:
        for batch in batches:
            loss = model(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
            rec.step(loss=loss)
    journal = read_journal(tmp_path / "run.jsonl")
    report = read_json(tmp_path / "run.json")
    for record in (journal, report):
        (trial,) = record.trials
        assert record.status == "ok" and trial.status == "ok"
        assert trial.source == "user-loop" and trial.precision == "fp32"
        assert record.config["model"] == "mine"
        assert [s.step for s in trial.steps] == [0, 1, 2, 3]
        # step 0 warms up, step 1 is counted: the summary leaves both out
        assert [s.warmup for s in trial.steps] == [True, True, False, False]
        assert trial.summary.steps_measured == 2
        assert [s.loss for s in trial.steps] == pytest.approx(losses, rel=1e-6)
        # padding excluded: 12 + 7 + 4 real tokens, not 3 x 12
        assert [s.tokens for s in trial.steps] == [23] * 4
        assert trial.flops.counted_per_step == expected_flops
        assert all(s.learning_rate == 1e-3 for s in trial.steps)
        assert all(s.mfu is None for s in trial.steps)  # no CPU peak
        assert "CPU" in trial.summary.mfu_reason
        assert trial.summary.skipped_steps == 0
        for s in trial.steps:
            assert s.tokens_per_s == pytest.approx(23 / (s.step_ms / 1e3))
    # the live journal and the report hold the same steps
    assert journal.trials[0].steps == report.trials[0].steps


def test_grad_scaler_overflow_records_skips_and_halving(tmp_path):
    model = tiny_gpt2()
    reference = copy.deepcopy(model)
    batch = padded_batch(0)

    def train(net, recorder=None, steps=8):
        opt = torch.optim.SGD(net.parameters(), lr=1e-2)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127, growth_interval=1000)
        scales, skipped = [], []
        rec = recorder(net, opt, scaler) if recorder else None
        if rec:
            rec.start()
        for _ in range(steps):
            before = scaler.get_scale()
            scaler.scale(net(**batch).loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            scales.append(scaler.get_scale())
            skipped.append(scaler.get_scale() < before)
            if rec:
                rec.step(loss=torch.tensor(0.0))
        if rec:
            rec.finish()
        return scales, skipped

    scales, skipped = train(reference)
    assert any(skipped) and not all(skipped)  # the forced overflow happened, then stopped

    def recorder(net, opt, scaler):
        return ampscope.Recorder(net, opt, scaler, journal=tmp_path / "s.jsonl")

    train(model, recorder)
    (trial,) = read_journal(tmp_path / "s.jsonl").trials
    assert trial.precision == "fp16-amp"  # a GradScaler without autocast names fp16-amp
    assert [s.loss_scale for s in trial.steps] == scales
    assert [s.skipped for s in trial.steps] == skipped
    assert trial.summary.skipped_steps == sum(skipped[COUNT_STEP + 1:])
    # each skip halves the scale (backoff 0.5)
    for prev, s in zip([2.0**127] + scales, trial.steps):
        if s.skipped:
            assert s.loss_scale == prev / 2
            assert s.grad_norm is None


def test_script_error_keeps_steps_and_marks_the_run(tmp_path):
    model = tiny_gpt2()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with pytest.raises(RuntimeError, match="data loader broke"):
        with ampscope.Recorder(model, opt, out=tmp_path / "r.json",
                               journal=tmp_path / "r.jsonl") as rec:
            for i in range(5):
                if i == 3:
                    raise RuntimeError("data loader broke")
                loss = model(**padded_batch(i)).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
                rec.step(loss=loss)
    record = read_journal(tmp_path / "r.jsonl")
    assert record.status == "error"
    (trial,) = record.trials
    assert trial.status == "error" and "data loader broke" in trial.reason
    # the user's own line, kept with the run
    assert "test_recorder.py" in trial.traceback and ", in test_script_error" in trial.traceback
    assert len(trial.steps) == 3
    assert read_json(tmp_path / "r.json").trials[0].steps == trial.steps


def test_bad_arguments_say_how_to_fix(tmp_path):
    model = tiny_gpt2()
    with pytest.raises(ValueError, match="choose from"):
        ampscope.Recorder(model, None, precision="fp7")
    with pytest.raises(ValueError, match="extension"):
        ampscope.Recorder(model, None, out=tmp_path / "r.txt")
    with pytest.raises(ValueError, match="nn.Module"):
        ampscope.Recorder("gpt2", None)


KILLED_SCRIPT = textwrap.dedent("""
    import sys, time, torch
    from transformers import GPT2Config, GPT2LMHeadModel
    import ampscope
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=96,
                                       n_positions=32, bos_token_id=0, eos_token_id=0))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 96, (2, 8))
    with ampscope.Recorder(model, opt, journal=sys.argv[1]) as rec:
        while True:
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward(); opt.step(); opt.zero_grad()
            rec.step(loss=loss)
            print(repr(loss.item()), flush=True)
            time.sleep(0.05)
""")


def test_killed_script_keeps_its_journal(tmp_path):
    journal = tmp_path / "killed.jsonl"
    script = tmp_path / "train.py"
    script.write_text(KILLED_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(journal)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    printed = []
    try:
        while len(printed) < 4:
            line = proc.stdout.readline()
            assert line, "the training script ended before its 4th step"
            printed.append(float(line))
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    record = read_journal(journal)
    assert record.status == "interrupted"
    (trial,) = record.trials
    assert trial.status == "cancelled" and trial.source == "user-loop"
    steps = trial.steps
    # each step is read back one step late: every printed step but the last was journaled
    assert len(steps) >= len(printed) - 1
    assert [s.loss for s in steps] == printed[:len(steps)]
    last = json.loads(journal.read_text().splitlines()[-1])
    assert last["e"] in ("step", "mon")  # no end: the process was killed


@pytest.mark.gpu
def test_cuda_loop_with_autocast_and_scaler(tmp_path):
    model = tiny_gpt2().cuda()
    reference = copy.deepcopy(model)
    batch = {k: v.cuda() for k, v in padded_batch(0).items()}
    counter = FlopCounterMode(display=False)
    with counter, torch.autocast("cuda", dtype=torch.float16):
        loss = reference(**batch).loss
    with counter:
        loss.backward()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda")
    losses = []
    with ampscope.Recorder(model, opt, scaler, journal=tmp_path / "g.jsonl") as rec:
        for _ in range(4):
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(**batch).loss
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            losses.append(loss.item())
            rec.step(loss=loss)
    (trial,) = read_journal(tmp_path / "g.jsonl").trials
    assert trial.precision == "fp16-amp"
    assert [s.loss for s in trial.steps] == pytest.approx(losses)
    assert all(s.allocated_bytes and s.loss_scale is not None for s in trial.steps)
    assert trial.flops.counted_per_step == counter.get_total_flops()
    # the allocator peak covers the measured steps (warm-up and counting steps left out)
    assert trial.memory.peak_allocated_bytes >= max(s.allocated_bytes for s in trial.steps
                                                    if not s.warmup)
