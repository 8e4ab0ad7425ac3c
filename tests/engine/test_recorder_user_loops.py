"""ampscope.Recorder on loops written the way users write them (issue #19).

Each figure is checked against what the loop itself computed: the lr the scheduler gave
the optimizer step, clip_grad_norm_'s own result, a norm computed here, FlopCounterMode
over the training step alone.
"""

import copy
import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import GPT2Config, GPT2LMHeadModel

import ampscope
from engine.record.journal import read_journal
from engine.record.json_report import read_json
from tests.engine.test_recorder import padded_batch, tiny_gpt2


def test_nanogpt_loop_records_the_lr_used_and_clip_grad_norms_result(tmp_path):
    """nanoGPT's train.py shape: a warm-up + decay schedule, clip_grad_norm_ after
    unscaling, an evaluation under model.eval() + no_grad, rec.step() last."""
    model = tiny_gpt2()
    reference = copy.deepcopy(model)
    batches = [padded_batch(i) for i in range(6)]
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: min(1.0, (it + 1) / 3) * 0.9**it)
    scaler = torch.amp.GradScaler("cpu", enabled=False)  # nanoGPT's scaler off in fp32
    used_lr, clip_norms = [], []
    with ampscope.Recorder(model, opt, scaler, journal=tmp_path / "n.jsonl") as rec:
        for it, batch in enumerate(batches):
            if it == 1:  # evaluation inside the FLOP-counting step
                model.eval()
                with torch.no_grad():
                    model(input_ids=batch["input_ids"])
                model.train()
            loss = model(**batch).loss
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            clip_norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)))
            used_lr.append(opt.param_groups[0]["lr"])
            scaler.step(opt)
            scaler.update()
            sched.step()  # the lr changes before rec.step() runs
            opt.zero_grad(set_to_none=True)
            rec.step(loss=loss)
    (trial,) = read_journal(tmp_path / "n.jsonl").trials
    assert [s.learning_rate for s in trial.steps] == pytest.approx(used_lr, rel=1e-12)
    assert used_lr[1:] != used_lr[:-1]  # the schedule did move the lr at every step
    # the pre-clipping norm the loop's clip_grad_norm_ returned, not the clipped one
    assert [s.grad_norm for s in trial.steps] == pytest.approx(clip_norms, rel=1e-6)
    assert all(n > 0.5 for n in clip_norms)  # every step was clipped: the two differ
    assert any("clip_grad_norm_'s own result" in note for note in trial.notes)
    # hardware FLOPs of the training step only: the evaluation forward is left out
    counter = FlopCounterMode(display=False)
    with counter:
        reference(**batches[1]).loss.backward()
    assert trial.flops.counted_per_step == counter.get_total_flops()
    assert torch.nn.utils.clip_grad_norm_.__module__ == "torch.nn.utils.clip_grad"  # restored


def test_grad_norm_measured_when_the_loop_gives_none(tmp_path):
    model = tiny_gpt2()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    expected_norms, used_lr = [], []
    with ampscope.Recorder(model, opt, journal=tmp_path / "g.jsonl") as rec:
        for i in range(4):
            model(**padded_batch(i)).loss.backward()
            # the 2-norm over all gradients, computed here by its definition
            squares = sum(float((p.grad.double() ** 2).sum()) for p in model.parameters()
                          if p.grad is not None)
            expected_norms.append(squares ** 0.5)
            used_lr.append(sched.get_last_lr()[0])
            opt.step()
            sched.step()
            opt.zero_grad()
            rec.step()
    (trial,) = read_journal(tmp_path / "g.jsonl").trials
    assert [s.grad_norm for s in trial.steps] == pytest.approx(expected_norms, rel=1e-5)
    assert [s.learning_rate for s in trial.steps] == pytest.approx(used_lr)
    assert any("measured by AmpScope at the optimizer step" in n for n in trial.notes)


def test_accelerate_bf16_loop_is_recorded_as_bf16_autocast(tmp_path):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    try:
        accelerator = Accelerator(mixed_precision="bf16", cpu=True)
        model = tiny_gpt2()
        reference = copy.deepcopy(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, opt = accelerator.prepare(model, opt)
        batches = [padded_batch(i) for i in range(4)]
        with ampscope.Recorder(model, opt, journal=tmp_path / "a.jsonl") as rec:
            for batch in batches:
                loss = model(**batch).loss
                accelerator.backward(loss)
                opt.step()
                opt.zero_grad()
                rec.step(loss=loss)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    (trial,) = read_journal(tmp_path / "a.jsonl").trials
    assert trial.precision == "bf16-amp"
    assert "autocast bfloat16" in trial.recipe
    # what ran: FlopCounterMode over the same step under bf16 autocast, counted here
    by_dtype = {}
    counter = FlopCounterMode(display=False)
    with counter:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = reference(**batches[1]).loss
        loss.backward()
    assert trial.flops.counted_per_step == counter.get_total_flops()
    by_dtype = trial.flops.by_peak_dtype
    assert by_dtype["bf16"] > 0.5 * trial.flops.counted_per_step


def test_run_says_where_it_is_and_its_journal_exists_from_the_start(tmp_path, capfd):
    model = tiny_gpt2()
    journal = tmp_path / "start.jsonl"
    rec = ampscope.Recorder(model, torch.optim.SGD(model.parameters(), lr=0.1),
                            journal=journal)
    rec.start()
    err = capfd.readouterr().err
    assert err.count(rec.run_id) >= 1 and str(journal) in err
    assert len(err.strip().splitlines()) == 1  # once
    assert json.loads(journal.read_text().splitlines()[0])["e"] == "journal"
    rec.finish()


def test_step_never_called_keeps_the_users_exception_and_writes_what_is_known(tmp_path):
    model = tiny_gpt2()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError) as info:
        with ampscope.Recorder(model, opt, out=tmp_path / "r.json", journal=tmp_path / "r.jsonl"):
            raise ValueError("my data is wrong")
    assert str(info.value) == "my data is wrong"
    assert info.value.__context__ is None  # nothing of AmpScope's chained over it
    for record in (read_journal(tmp_path / "r.jsonl"), read_json(tmp_path / "r.json")):
        assert record.status == "error"
        (trial,) = record.trials
        assert trial.steps == [] and "my data is wrong" in trial.reason


def test_step_never_called_says_so_in_one_line(tmp_path, capfd):
    model = tiny_gpt2()
    with ampscope.Recorder(model, None, out=tmp_path / "r.json", journal=tmp_path / "r.jsonl"):
        pass
    err = capfd.readouterr().err.strip().splitlines()
    assert sum("recorded no step" in line for line in err) == 1
    assert read_json(tmp_path / "r.json").trials[0].summary.steps_measured == 0


def test_finished_recorder_refuses_to_be_used_again(tmp_path):
    model = tiny_gpt2()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ampscope.Recorder(model, opt, journal=tmp_path / "f.jsonl") as rec:
        for i in range(2):
            model(**padded_batch(i)).loss.backward()
            opt.step()
            rec.step()
    with pytest.warns(RuntimeWarning, match="already finished"):
        rec.step()
        rec.step()
    assert len(read_journal(tmp_path / "f.jsonl").trials[0].steps) == 2
    with pytest.raises(RuntimeError, match="new ampscope.Recorder"):
        with rec:
            pass


def test_meta_device_model_is_named_as_such():
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=96, n_positions=32)
    with torch.device("meta"):
        model = GPT2LMHeadModel(config)
    with pytest.raises(ValueError, match="meta device") as info:
        ampscope.Recorder(model, None)
    assert "cuda" not in str(info.value)


def test_recorder_without_optimizer_records_what_it_can(tmp_path):
    model = tiny_gpt2()
    losses = []
    with ampscope.Recorder(model, journal=tmp_path / "o.jsonl") as rec:
        for i in range(3):
            loss = model(**padded_batch(i)).loss
            loss.backward()
            with torch.no_grad():  # a hand-written SGD update, no torch optimizer
                for p in model.parameters():
                    p -= 0.01 * p.grad
                    p.grad = None
            losses.append(loss.item())
            rec.step(loss=loss)
    record = read_journal(tmp_path / "o.jsonl")
    (trial,) = record.trials
    assert "optimizer" not in record.config
    assert [s.loss for s in trial.steps] == pytest.approx(losses)
    assert all(s.learning_rate is None and s.grad_norm is None for s in trial.steps)
    assert trial.memory.optimizer_bytes == 0


def test_log_journals_an_evaluation_at_the_step_it_followed(tmp_path):
    """nanoGPT evaluates at the top of iteration k, after step k-1 (iteration 0's has no
    step before it: step 0); an evaluation after the last step is at the last step."""
    model = tiny_gpt2()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    evals = {}
    val = padded_batch(99)
    with ampscope.Recorder(model, opt, out=tmp_path / "l.json",
                           journal=tmp_path / "l.jsonl") as rec:
        for it in range(5):
            if it % 2 == 0:  # nanoGPT's estimate_loss at the top of the iteration
                model.eval()
                with torch.no_grad():
                    eval_loss = model(**val).loss
                model.train()
                evals[it] = float(eval_loss)
                rec.log(eval_loss=eval_loss, tokens_seen=it * 23)
            model(**padded_batch(it)).loss.backward()
            opt.step()
            opt.zero_grad()
            rec.step()
        with pytest.warns(RuntimeWarning, match="pass a number"):
            rec.log(note="not a number")
        rec.log(final_loss=1.5)  # after the loop's last step (step 4)
    followed = {max(it - 1, 0): value for it, value in evals.items()}
    for record in (read_journal(tmp_path / "l.jsonl"), read_json(tmp_path / "l.json")):
        eval_losses = {s.step: s.value for s in record.scalars if s.name == "eval_loss"}
        assert eval_losses == pytest.approx(followed)
        seen = {s.step: s.value for s in record.scalars if s.name == "tokens_seen"}
        assert seen == {max(it - 1, 0): it * 23 for it in evals}
        assert [(s.step, s.value) for s in record.scalars if s.name == "final_loss"] == [
            (4, 1.5)]
        assert max(s.step for s in record.scalars) == len(record.trials[0].steps) - 1
        assert not any(s.name == "note" for s in record.scalars)


# --- a user's loop is never broken by AmpScope (issue #21) -----------------------------


def _train(model, opt, rec, steps, loss_of=lambda loss: loss, before_step=None):
    losses = []
    for i in range(steps):
        if before_step is not None:
            before_step(i)
        out = model(**padded_batch(i))
        loss = out.loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
        rec.step(loss=loss_of(loss))
    return losses


def test_step_before_the_first_forward_and_a_per_sample_loss_do_not_break_the_loop(tmp_path):
    model = tiny_gpt2()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with ampscope.Recorder(model, opt, journal=tmp_path / "v.jsonl") as rec:
        rec.step()  # before any forward: an empty step
        with pytest.warns(RuntimeWarning, match=r"shape \(3,\)") as caught:
            # a per-sample loss vector, as a loss with reduction="none" gives
            _train(model, opt, rec, 4, loss_of=lambda loss: loss.detach().expand(3))
    assert sum("shape (3,)" in str(w.message) for w in caught) == 1  # warned once
    (trial,) = read_journal(tmp_path / "v.jsonl").trials
    assert trial.status == "ok" and len(trial.steps) == 5
    assert trial.steps[0].tokens is None and trial.steps[0].loss is None
    assert all(s.loss is None for s in trial.steps[1:])
    assert [s.tokens for s in trial.steps[1:]] == [23] * 4  # the rest still recorded


def test_vanished_out_folder_never_replaces_the_users_exception(tmp_path):
    import shutil

    model = tiny_gpt2()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    out_dir = tmp_path / "reports"
    out_dir.mkdir()

    def vanish_then_fail(i):
        if i == 2:
            shutil.rmtree(out_dir)
        if i == 3:
            raise KeyError("my own bug")

    with pytest.warns(RuntimeWarning, match="could not be written") as caught:
        with pytest.raises(KeyError) as info:
            with ampscope.Recorder(model, opt, out=out_dir / "run.json",
                                   journal=tmp_path / "x.jsonl") as rec:
                _train(model, opt, rec, 5, before_step=vanish_then_fail)
    assert info.value.args == ("my own bug",) and info.value.__context__ is None
    (warning,) = [w for w in caught if "could not be written" in str(w.message)]
    assert str(tmp_path / "x.jsonl") in str(warning.message)  # where the run is instead
    record = read_journal(tmp_path / "x.jsonl")
    assert record.status == "error" and len(record.trials[0].steps) == 3


def test_unwritable_data_folder_warns_and_the_loop_goes_on(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the data folder should be")
    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(blocker))
    model = tiny_gpt2()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with pytest.warns(RuntimeWarning, match="could not be written.*goes on without a journal"):
        with ampscope.Recorder(model, opt, out=tmp_path / "r.json") as rec:
            losses = _train(model, opt, rec, 3)
    # the report still holds the run
    assert [s.loss for s in read_json(tmp_path / "r.json").trials[0].steps] == pytest.approx(
        losses, rel=1e-6)


def test_journal_pointing_at_an_existing_file_is_refused(tmp_path):
    existing = tmp_path / "old.jsonl"
    existing.write_text('{"e":"journal","version":1,"pid":1}\n')
    before = existing.read_text()
    with pytest.raises(ValueError, match="already exists"):
        ampscope.Recorder(tiny_gpt2(), None, journal=existing)
    assert existing.read_text() == before


CRASHING_SCRIPT = """
import sys, torch
from tests.engine.test_recorder import padded_batch, tiny_gpt2
import ampscope
model = tiny_gpt2()
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
rec = ampscope.Recorder(model, opt, journal=sys.argv[1])  # no with block, no finish()
rec.start()
for i in range(3):
    model(**padded_batch(i)).loss.backward()
    opt.step()
    opt.zero_grad()
    rec.step()
raise SystemError("script crashed")
"""


def test_script_dying_without_finish_ends_the_run_at_exit(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = tmp_path / "crash.py"
    script.write_text(CRASHING_SCRIPT)
    journal = tmp_path / "c.jsonl"
    proc = subprocess.run([sys.executable, str(script), str(journal)], capture_output=True,
                          text=True, timeout=300, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 1 and "script crashed" in proc.stderr
    record = read_journal(journal)
    assert record.status == "error"  # ended, not "interrupted"
    (trial,) = record.trials
    assert "script crashed" in trial.reason and len(trial.steps) == 3


def test_each_steps_time_is_split_into_data_forward_backward_optimizer(tmp_path):
    import time

    model = tiny_gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    spans = []  # what this loop measured around each phase, in ms
    with ampscope.Recorder(model, opt, out=tmp_path / "t.csv",
                           journal=tmp_path / "t.jsonl") as rec:
        for i in range(4):
            t0 = time.perf_counter()
            time.sleep(0.03)  # "loading data"
            batch = padded_batch(i)
            t1 = time.perf_counter()
            loss = model(**batch).loss
            t2 = time.perf_counter()
            loss.backward()
            time.sleep(0.02)  # work between backward and the optimizer step
            t3 = time.perf_counter()
            opt.step()
            time.sleep(0.01)
            opt.zero_grad()
            t4 = time.perf_counter()
            rec.step(loss=loss)
            spans.append({"data": (t1 - t0) * 1e3, "forward": (t2 - t1) * 1e3,
                          "backward": (t3 - t2) * 1e3, "optimizer": (t4 - t3) * 1e3})
    (trial,) = read_journal(tmp_path / "t.jsonl").trials
    for s, span in zip(trial.steps, spans):
        parts = [s.data_ms, s.forward_ms, s.backward_ms, s.optimizer_ms]
        assert sum(parts) == pytest.approx(s.step_ms, rel=1e-9)
        # each phase holds its sleep, and no more than the span around it (plus the step
        # boundary's few Python lines, which the loop's clocks do not see)
        assert 30 <= s.data_ms
        assert 0 < s.forward_ms <= span["forward"]
        assert 20 <= s.backward_ms <= span["backward"] + span["forward"]
        assert 10 <= s.optimizer_ms
    for s, span in zip(trial.steps[1:], spans[1:]):  # step 0 also holds the warm-up start
        assert s.data_ms <= span["data"] + 15
        assert s.optimizer_ms <= span["optimizer"] + 15
    # the report's line: each phase's share of the measured steps' time
    measured = [s for s in trial.steps if not s.warmup]
    total = sum(s.step_ms for s in measured)
    data_share = 100 * sum(s.data_ms for s in measured) / total
    (line,) = [n for n in trial.notes if n.startswith("where the step time went")]
    assert f"{data_share:.0f}% waiting for data" in line
    # the same four as columns of the CSV report
    import csv

    with open(tmp_path / "t.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    for row, s in zip(rows, trial.steps, strict=True):
        for column in ("data_ms", "forward_ms", "backward_ms", "optimizer_ms"):
            assert float(row[column]) == getattr(s, column)


def test_watch_shows_the_logged_scalars(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    model = tiny_gpt2()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    journal = tmp_path / "w.jsonl"
    with ampscope.Recorder(model, opt, journal=journal) as rec:
        for i in range(3):
            model(**padded_batch(i)).loss.backward()
            opt.step()
            opt.zero_grad()
            rec.log(eval_loss=0.25 * (i + 1))
            rec.step()
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, str(root / "main.py"), "watch", str(journal)],
                          capture_output=True, text=True, timeout=120, cwd=root)
    assert proc.returncode == 0
    shown = [line.split() for line in proc.stdout.splitlines() if "eval_loss" in line]
    assert [(int(w[1]), float(w[-1])) for w in shown] == [(0, 0.25), (1, 0.5), (2, 0.75)]
