"""The Trainer callback ends its run on every way out of ``trainer.train()`` (issue #32):
a user's callback raising in ``on_step_end``, ``optimizer.step`` raising, and a real
SIGINT delivered to a real child process while it is in ``on_step_end``. Each time the
journal has its end line, ``python3 main.py report`` opens it, and no ``ampscope-monitor``
thread is alive once ``train()`` is left."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from transformers import TrainerCallback

import ampscope
from engine.record.journal import read_journal
from tests.engine.test_trainer_callback import ROOT, no_monitor_left, tiny_trainer


def _end_line(journal) -> dict:
    lines = [json.loads(x) for x in journal.read_text().splitlines()]
    assert lines[-1]["e"] == "end", lines[-1]
    return lines[-1]


def _report_opens(journal, tmp_path) -> None:
    out = tmp_path / "opened.html"
    proc = subprocess.run([sys.executable, "main.py", "report", str(journal), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 0


class RaisingCallback(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            raise RuntimeError("my callback broke")


@pytest.mark.parametrize("added", ["at init", "add_callback"])
def test_a_users_callback_raising_in_on_step_end_ends_the_run(tmp_path, added):
    journal = tmp_path / "cb.jsonl"
    ours = ampscope.AmpScopeCallback(out=tmp_path / "cb.json", journal=journal)
    if added == "at init":
        trainer = tiny_trainer(tmp_path, ours)
        trainer.add_callback(RaisingCallback())
    else:  # added after the Trainer was made: train() itself is not wrapped
        trainer = tiny_trainer(tmp_path, RaisingCallback())
        trainer.add_callback(ours)
        assert "train" not in vars(trainer)
    with pytest.raises(RuntimeError, match="^my callback broke$"):
        trainer.train()
    assert no_monitor_left()
    assert torch._C._len_torch_dispatch_stack() == 0
    assert _end_line(journal)["status"] == "error"
    record = read_journal(journal)
    (trial,) = record.trials
    assert trial.status == "error" and "my callback broke" in trial.reason
    assert (tmp_path / "cb.json").exists()
    # the handler is the Trainer's own again
    assert "call_event" not in vars(trainer.callback_handler)
    _report_opens(journal, tmp_path)


class BrokenSGD(torch.optim.SGD):
    calls = 0

    def step(self, closure=None):
        BrokenSGD.calls += 1
        if BrokenSGD.calls == 3:
            raise ValueError("optimizer broke")
        return super().step(closure)


def test_optimizer_step_raising_ends_the_run_before_train_returns(tmp_path):
    journal = tmp_path / "opt.jsonl"
    trainer = tiny_trainer(tmp_path, ampscope.AmpScopeCallback(journal=journal))
    BrokenSGD.calls = 0
    trainer.optimizer = BrokenSGD(trainer.model.parameters(), lr=1e-2)
    with pytest.raises(ValueError, match="^optimizer broke$"):
        trainer.train()
    assert no_monitor_left()
    assert _end_line(journal)["status"] == "error"
    (trial,) = read_journal(journal).trials
    assert "optimizer broke" in trial.reason and len(trial.steps) == 2
    _report_opens(journal, tmp_path)


SIGINT_SCRIPT = textwrap.dedent("""
    import sys, threading, time
    from pathlib import Path
    from transformers import TrainerCallback
    from tests.engine.test_trainer_callback import tiny_trainer
    import ampscope

    class Slow(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                Path(sys.argv[3]).write_text("in on_step_end")
                while True:  # the parent's SIGINT lands here
                    time.sleep(0.01)

    trainer = tiny_trainer(Path(sys.argv[2]), ampscope.AmpScopeCallback(journal=sys.argv[1]))
    trainer.add_callback(Slow())
    try:
        trainer.train()
    except KeyboardInterrupt:
        alive = [t.name for t in threading.enumerate() if t.name == "ampscope-monitor"]
        print("monitors alive after train():", len(alive), flush=True)
        sys.exit(130)
""")


def test_a_real_sigint_in_on_step_end_ends_the_run_as_cancelled(tmp_path):
    script, journal, marker = tmp_path / "train.py", tmp_path / "int.jsonl", tmp_path / "in"
    script.write_text(SIGINT_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(journal), str(tmp_path),
                             str(marker)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert "monitors alive after train(): 0" in out
    assert _end_line(journal)["status"] == "cancelled"
    (trial,) = read_journal(journal).trials
    assert trial.status == "cancelled" and len(trial.steps) == 2
    _report_opens(journal, tmp_path)
