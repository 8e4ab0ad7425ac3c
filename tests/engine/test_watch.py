"""``main.py watch``: the real process follows a journal this test appends to."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.core.events import (
    MonitorSample,
    RunFinished,
    RunStarted,
    StepSample,
    TrialFinished,
    TrialResult,
    TrialStarted,
)
from engine.record.follow import JournalFollower
from engine.record.journal import JournalWriter

ROOT = Path(__file__).resolve().parents[2]


def step(i: int, skipped: bool = False) -> StepSample:
    return StepSample(precision="fp16-amp", step=i, warmup=i == 0, loss=4.0 - i / 8,
                      step_ms=20.0, tokens_per_s=1600.0 + i, tflops=None, mfu=None,
                      allocated_bytes=None, reserved_bytes=None,
                      loss_scale=32768.0 / (2 if skipped else 1), skipped=skipped,
                      grad_norm=None, time_s=time.time(), tokens=32)


def start(writer: JournalWriter) -> None:
    writer.write(RunStarted("watched01", {"model": "mine", "precisions": ["fp16-amp"],
                                          "source": "user-loop"}, {}, time.time()))
    writer.write(TrialStarted("fp16-amp", 0, 1, time.time()))
    writer.write(MonitorSample(time.time(), "host", host_rss_bytes=300 * 2**20))


def spawn(journal: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "main.py"), "watch", str(journal),
                             "--interval", "0.05"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def read_until(proc: subprocess.Popen, step_index: int) -> list[str]:
    """Lines printed up to the one of step ``step_index``."""
    lines = []
    while True:
        line = proc.stdout.readline()
        assert line, f"watch ended before step {step_index}: {lines} {proc.stderr.read()}"
        lines.append(line.rstrip("\n"))
        if line.split()[:2] == ["fp16-amp", str(step_index)]:
            return lines


def test_watch_follows_a_growing_journal_until_the_run_ends(tmp_path):
    journal = tmp_path / "run.jsonl"
    writer = JournalWriter(journal)
    start(writer)
    writer.write(step(0))
    proc = spawn(journal)
    try:
        first = read_until(proc, 0)
        assert "run watched01: mine (user-loop)" in first[0]
        # appended while watch runs: a skipped step, then a half-written line it must wait for
        writer.write(step(1, skipped=True))
        later = read_until(proc, 1)
        writer._fh.write('{"e":"step","precision":"fp16-amp","st')
        writer._fh.flush()
        time.sleep(0.3)
        writer._fh.write('ep":2,"warmup":false,"loss":3.5,"step_ms":20.0,"tokens_per_s":1602.0,'
                         '"skipped":false,"time_s":1.0}\n')
        writer._fh.flush()
        later += read_until(proc, 2)
        writer.write(TrialFinished(TrialResult("fp16-amp", "ok"), time.time()))
        writer.write(RunFinished("ok", time.time()))
        writer.close()
        rest = proc.stdout.read().splitlines()
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    step0 = first[-1].split()
    assert step0[:4] == ["fp16-amp", "0", "4.0000", "3.277e+04"]
    assert "1,600" in first[-1] and "rss 300.0 MiB" in first[-1] and "warm-up" in first[-1]
    assert "SKIPPED" in later[0] and "1.638e+04" in later[0]
    assert later[-1].split()[2] == "3.5000"
    assert rest[-1] == "run ended: ok, 3 steps"


def test_ctrl_c_ends_the_view_with_one_line(tmp_path):
    journal = tmp_path / "run.jsonl"
    writer = JournalWriter(journal)
    start(writer)
    writer.write(step(0))
    proc = spawn(journal)
    try:
        read_until(proc, 0)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    writer.close()
    assert proc.returncode == 0
    assert err.strip().splitlines() == ["ampscope: stopped watching (the run itself goes on)"]


def test_bad_journal_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "notes.jsonl"
    bad.write_text('{"hello": 1}\n')
    for target, message in ((bad, "not an AmpScope run journal"),
                            (tmp_path / "missing.jsonl", "journal not found"),
                            (tmp_path, "is a folder")):
        done = subprocess.run([sys.executable, str(ROOT / "main.py"), "watch", str(target)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2
        assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr


def test_follower_returns_only_complete_new_lines(tmp_path):
    journal = tmp_path / "run.jsonl"
    writer = JournalWriter(journal)
    follower = JournalFollower(journal)
    assert follower.poll() == []
    start(writer)
    kinds = [type(e).__name__ for e in follower.poll()]
    assert kinds == ["RunStarted", "TrialStarted", "MonitorSample"]
    writer._fh.write('{"e":"end","status":"ok",')
    writer._fh.flush()
    assert follower.poll() == [] and not follower.finished
    writer._fh.write('"time_s":2.0}\n')
    writer._fh.flush()
    assert follower.poll() == [RunFinished("ok", 2.0)] and follower.finished
    writer.close()


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_watch_prints_a_recorder_runs_lr_grad_norm_time_split_and_scalars(tmp_path, family):
    """A user's loop (real Recorder, a scheduler, rec.log every other step): each step's
    line has the lr its optimizer step used, the grad norm, the time split and its bar."""
    import torch

    import ampscope
    from engine.record.journal import read_journal
    from tests.engine.test_recorder import padded_batch, tiny_gpt2, tiny_llama

    model = {"gpt2": tiny_gpt2, "llama": tiny_llama}[family]()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    journal = tmp_path / "mine.jsonl"
    used_lr, norms, evals = [], [], {}
    with ampscope.Recorder(model, opt, journal=journal) as rec:
        for it in range(5):
            loss = model(**padded_batch(it)).loss
            loss.backward()
            norms.append(float(torch.linalg.vector_norm(torch.stack(
                [p.grad.norm() for p in model.parameters() if p.grad is not None]))))
            used_lr.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
            opt.zero_grad()
            if it % 2:
                evals[it] = loss.item() / 2
                rec.log(eval_loss=evals[it])
            rec.step(loss=loss)
    done = subprocess.run([sys.executable, str(ROOT / "main.py"), "watch", str(journal)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    steps = read_journal(journal).trials[0].steps
    lines = [line for line in done.stdout.splitlines() if " lr " in line]
    assert len(lines) == 5
    for line, lr, norm, s in zip(lines, used_lr, norms, steps):
        assert f"lr {lr:.4g} " in line
        printed_norm = float(line.split("grad norm ")[1].split()[0])
        assert printed_norm == pytest.approx(norm, rel=1e-3)
        split = [s.data_ms, s.forward_ms, s.backward_ms, s.optimizer_ms]
        assert f"ms: data {split[0]:.1f} fwd {split[1]:.1f} bwd {split[2]:.1f} " \
               f"opt {split[3]:.1f}" in line
        bar = line.split("[")[1].split("]")[0]
        assert len(bar) == 20
        # each phase's characters are its share of the step, to within one character
        for char, ms in zip("dfbo", split):
            assert abs(bar.count(char) - 20 * ms / sum(split)) < 1
    for it, value in evals.items():
        assert f"{it:>6} eval_loss = {value:.6g}" in done.stdout


def test_watch_reads_an_older_journals_nvml_nan_as_na_and_says_so_once(tmp_path):
    """An AmpScope from before 2026-11-27 wrote NVML GPM's NaN (an idle window) into the
    journal's monitor lines, as on the first H200 run: watching such a journal shows every
    step, and says once which field was read as n/a."""
    journal = tmp_path / "run.jsonl"
    writer = JournalWriter(journal)
    start(writer)
    for i in range(3):  # the old writer's line, as json.dump with NaN allowed wrote it
        writer._fh.write(f'{{"e":"mon","t":{time.time():f},"src":"gpu","db":NaN,"sm":0.0}}\n')
        writer.write(step(i))
    writer.write(TrialFinished(TrialResult("fp16-amp", "ok"), time.time()))
    writer.write(RunFinished("ok", time.time()))
    writer.close()
    done = subprocess.run([sys.executable, str(ROOT / "main.py"), "watch", str(journal),
                           "--interval", "0.05"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[-1] == "run ended: ok, 3 steps"
    notes = [line for line in out if "was repaired on reading" in line]
    assert len(notes) == 1 and "gpm_dram_bw_util_pct" in notes[0], out
