"""No process outlives the command that started it: the CLI is SIGKILLed (no handler can
run) during a distributed trial and during fit, and every process it had must end;
``numerics`` and ``plan`` run in their one process, which the tests assert (the window's
trial child: tests/gui/test_window_orphans.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.engine.test_run_endings import ROOT, TINY, _assert_none_left, _journal_steps

POLL_S = 0.2


def _spawn(tmp_path: Path, *args: str) -> subprocess.Popen:
    # output to a file: a pipe would make waiting for the killed CLI wait for its orphans
    env = dict(os.environ, AMPSCOPE_DATA_DIR=str(tmp_path / "data"), OMP_NUM_THREADS="1")
    with open(tmp_path / "cli.log", "wb") as log:
        return subprocess.Popen([sys.executable, "main.py", *args], cwd=ROOT, env=env,
                                stdout=log, stderr=subprocess.STDOUT)


def _descendants(proc: subprocess.Popen) -> list[psutil.Process]:
    return psutil.Process(proc.pid).children(recursive=True)


def _wait(proc: subprocess.Popen, ready, what: str) -> list[psutil.Process]:
    """Wait until ``ready(descendants)``; returns the processes seen until then (a process
    that started and ended on the way is not one that can be left)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        assert proc.poll() is None, (proc.args, proc.returncode)
        found = _descendants(proc)
        if ready(found):
            return found
        time.sleep(POLL_S)
    raise AssertionError(f"never saw {what}")


def _cmd(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def test_sigkill_during_a_distributed_trial_leaves_no_launcher_and_no_rank(tmp_path):
    proc = _spawn(tmp_path, "profile", *TINY, "--precision", "fp32", "--steps", "5000",
                  "--strategy", "ddp", "--nproc-per-node", "2")
    journal = tmp_path / "data" / "runs"

    def ranks_stepping(found):
        ranks = [p for p in found if "engine.distributed.rank_main" in _cmd(p)]
        files = list(journal.glob("*.jsonl"))
        return len(ranks) == 2 and files and _journal_steps(files[0])
    found = _wait(proc, ranks_stepping, "both ranks training")
    assert any("engine.distributed.launch" in _cmd(p) for p in found)
    proc.kill()
    proc.wait()
    _assert_none_left(found)


def _rss(p: psutil.Process) -> int:
    try:
        return p.memory_info().rss
    except psutil.Error:
        return 0


def test_sigkill_during_fit_leaves_no_probe(tmp_path):
    # a gpt2 probe at 256 tokens trains for minutes on a CPU; it is killed once it holds
    # the model (past the start-up, where a probe whose parent is gone fails on its own)
    proc = _spawn(tmp_path, "fit", "--model", "gpt2", "--precision", "fp32", "--seq-len",
                  "256", "--device", "cpu", "--memory-budget", "64GiB", "--max-batch", "64",
                  "--quiet")

    def probe_holds_the_model(found):
        return any("spawn_main" in _cmd(p) and _rss(p) > 600 * 2**20 for p in found)
    found = _wait(proc, probe_holds_the_model, "a probe holding gpt2")
    proc.kill()
    proc.wait()
    _, alive = psutil.wait_procs(found, timeout=10)
    for p in alive:
        p.kill()
    assert alive == [], [_cmd(p) for p in alive]


def test_a_hung_rank_ends_the_trial_as_an_error_naming_the_rank(tmp_path):
    import json
    import signal

    out = tmp_path / "report.json"
    proc = _spawn(tmp_path, "profile", *TINY, "--precision", "fp32", "--steps", "5000",
                  "--strategy", "ddp", "--nproc-per-node", "2", "--stall-timeout", "5",
                  "--out", str(out))
    journal = tmp_path / "data" / "runs"

    def ranks_stepping(found):
        ranks = [p for p in found if "engine.distributed.rank_main" in _cmd(p)]
        files = list(journal.glob("*.jsonl"))
        return len(ranks) == 2 and files and len(_journal_steps(files[0])) >= 2
    found = _wait(proc, ranks_stepping, "both ranks training")
    rank = next(p for p in found if "engine.distributed.rank_main" in _cmd(p))
    rank.send_signal(signal.SIGSTOP)  # hung: alive, but never steps again
    try:
        assert proc.wait(timeout=300) == 1
    finally:
        for p in found:
            try:
                p.kill()
            except psutil.Error:
                pass
    trial = json.loads(out.read_text())["trials"][0]
    assert trial["status"] == "error"
    assert "made no step for" in trial["reason"] and "--stall-timeout" in trial["reason"]
    assert "rank " in trial["reason"]
    _assert_none_left([p for p in found if p.pid != rank.pid])


def _children_until(proc: subprocess.Popen, log: Path, marker: str) -> list[psutil.Process]:
    """Every process ``proc`` had from its start until ``marker`` shows in its output (a
    stage late in its work); the command must still be running then."""
    seen: dict[int, psutil.Process] = {}
    deadline = time.monotonic() + 600
    while marker not in log.read_text(errors="replace"):
        assert proc.poll() is None, (proc.args, proc.returncode, log.read_text()[-2000:])
        assert time.monotonic() < deadline, f"never saw {marker!r}"
        seen.update((p.pid, p) for p in _descendants(proc))
        time.sleep(POLL_S / 4)
    return list(seen.values())


def _kill_childless(proc: subprocess.Popen, log: Path, marker: str) -> None:
    """A command with no child of its own: once it reaches ``marker`` it has none, and
    what it started on the way (ctypes' ``find_library`` runs ``/sbin/ldconfig -p`` while
    a library imports) ended on its own while it ran; SIGKILL then leaves nothing."""
    had = _children_until(proc, log, marker)
    at_kill = _descendants(proc)
    proc.kill()
    proc.wait()
    assert at_kill == [], [_cmd(p) for p in at_kill]
    assert [p for p in had if p.is_running()] == []


def test_numerics_runs_in_one_process_so_a_sigkill_leaves_nothing(tmp_path):
    # the CLI's numerics lab runs inline (profile --numerics and the window use a child)
    proc = _spawn(tmp_path, "numerics", "--model", "tiny", "--precision", "fp16-amp",
                  "--device", "cpu", "--batch-size", "1", "--seq-len", "8")
    _kill_childless(proc, tmp_path / "cli.log", "numerics: numeric demonstrations")


def test_plan_runs_in_one_process_so_a_sigkill_leaves_nothing(tmp_path):
    # plan traces on fake tensors in its own process, one precision after the other
    proc = _spawn(tmp_path, "plan", "--model", "tiny", "--precision", "fp32,bf16-amp",
                  "--seq-len", "16", "--card", "H100 SXM", "--max-batch", "0")
    _kill_childless(proc, tmp_path / "cli.log", "plan: bf16-amp: tracing")
