"""Every way a run can end, tried on the real CLI process with real signals.

Each test starts ``python main.py profile`` with the tiny preset, waits until the
run's journal holds measured steps, ends the run its way and then checks: no process
of the run is left, the journal holds every step measured before the ending, and the
report (or the one-line message) says what happened.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from engine.record.journal import read_journal
from engine.run.runner import TERMINATE_GRACE_S

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--model", "tiny", "--batch-size", "1", "--seq-len", "16", "--warmup", "1",
        "--device", "cpu"]
POLL_S = 0.1
# A stopped run ends a trial that does not stop on its own after TERMINATE_GRACE_S (the
# longest timer, after SIGTERM's grace of as long): a step held three times that long
# outlasts every timer the run has (the trial was once ended 30 s after a Ctrl-C).
OUTLAST_S = 3 * TERMINATE_GRACE_S


def _start(tmp_path: Path, *args: str, new_session: bool = False) -> subprocess.Popen:
    env = dict(os.environ, AMPSCOPE_DATA_DIR=str(tmp_path / "data"), OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "main.py", "profile", *TINY, *args], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=new_session)


def _journal(tmp_path: Path) -> Path | None:
    found = list((tmp_path / "data" / "runs").glob("*.jsonl"))
    return found[0] if found else None


def _journal_steps(path: Path | None, precision: str | None = None) -> list[dict]:
    if path is None:
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            data = json.loads(line)
        except ValueError:
            continue  # a line being written
        if data.get("e") == "step" and precision in (None, data["precision"]):
            steps.append(data)
    return steps


def _wait_for_steps(proc: subprocess.Popen, tmp_path: Path, count: int,
                    precision: str = "fp32") -> list[psutil.Process]:
    """Wait until the journal holds ``count`` steps; returns the run's processes then."""
    while len(_journal_steps(_journal(tmp_path), precision)) < count:
        assert proc.poll() is None, proc.communicate()
        time.sleep(POLL_S)
    return psutil.Process(proc.pid).children(recursive=True)


def _read_until(proc: subprocess.Popen, text: str) -> str:
    """The CLI's stderr read line by line until ``text`` shows; returns what was read."""
    seen = ""
    while text not in seen:
        line = proc.stderr.readline()
        assert line, f"the CLI ended before it said {text!r}: {seen}"
        seen += line
    return seen


def trial_processes(found: list[psutil.Process]) -> list[psutil.Process]:
    """The trial processes among a run's ``found``: a spawned interpreter (``spawn_main``) or,
    on the CPU, a child of the trials' forkserver (it shares the server's command line)."""
    def is_trial(p: psutil.Process) -> bool:
        try:
            if "spawn_main" in " ".join(p.cmdline()):
                return True
            parent = p.parent()
            return parent is not None and "forkserver" in " ".join(parent.cmdline())
        except psutil.Error:
            return False
    return [p for p in found if is_trial(p)]


def _assert_none_left(processes: list[psutil.Process]) -> None:
    """Every process the run had is gone (the resource tracker ends with its parent)."""
    assert processes, "the run had no child process to check"
    _, alive = psutil.wait_procs(processes, timeout=30)
    assert alive == [], [p.cmdline() for p in alive]


def _report(path: Path) -> dict:
    return json.loads(path.read_text())


def _steps_of(report: dict, precision: str) -> list[int]:
    trial = next(t for t in report["trials"] if t["precision"] == precision)
    return [s["step"] for s in trial["steps"]]


@pytest.mark.parametrize(("sig", "name"), [(signal.SIGTERM, "SIGTERM"),
                                           (signal.SIGHUP, "SIGHUP")])
def test_sigterm_and_sighup_stop_the_run_and_write_what_was_measured(tmp_path, sig, name):
    out = tmp_path / "r.json"
    proc = _start(tmp_path, "--precision", "fp32,bf16", "--steps", "500", "--out", str(out))
    children = _wait_for_steps(proc, tmp_path, 3)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate()
    assert proc.returncode == 128 + sig, stderr
    _assert_none_left(children)
    assert f"stopped by {name}" in stderr and "Traceback" not in stderr
    report = _report(out)
    assert report["status"] == "cancelled"
    fp32 = next(t for t in report["trials"] if t["precision"] == "fp32")
    assert fp32["status"] == "cancelled" and fp32["memory"] is not None
    assert fp32["dtype_map"] and fp32["summary"]["steps_measured"] >= 2
    journaled = [s["step"] for s in _journal_steps(_journal(tmp_path), "fp32")]
    assert _steps_of(report, "fp32") == journaled == list(range(len(journaled)))
    bf16 = next(t for t in report["trials"] if t["precision"] == "bf16")
    assert bf16["status"] == "cancelled" and "before this trial started" in bf16["reason"]
    assert "Precision" in stdout  # the table


def test_first_ctrl_c_keeps_the_interrupted_trials_measurements(tmp_path):
    """Ctrl-C reaches the whole process group: the child ignores it, the parent cancels."""
    out = tmp_path / "r.json"
    proc = _start(tmp_path, "--precision", "fp32", "--steps", "500", "--out", str(out),
                  new_session=True)
    children = _wait_for_steps(proc, tmp_path, 3)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    _, stderr = proc.communicate()
    assert proc.returncode == 130
    _assert_none_left(children)
    assert "KeyboardInterrupt" not in stderr and "Traceback" not in stderr
    (fp32,) = _report(out)["trials"]
    assert fp32["status"] == "cancelled" and "stopped by the user after" in fp32["reason"]
    assert fp32["memory"]["params_bytes"] > 0 and fp32["dtype_map"]
    assert fp32["summary"]["median_step_ms"] > 0
    journaled = [s["step"] for s in _journal_steps(_journal(tmp_path), "fp32")]
    assert [s["step"] for s in fp32["steps"]] == journaled


def test_second_ctrl_c_stops_at_once_and_still_writes_the_report(tmp_path):
    out = tmp_path / "r.html"
    proc = _start(tmp_path, "--precision", "fp32,bf16", "--steps", "500", "--out", str(out),
                  new_session=True)
    children = _wait_for_steps(proc, tmp_path, 3)
    os.killpg(proc.pid, signal.SIGINT)
    seen = _read_until(proc, "Ctrl-C again")  # a person presses twice, not within microseconds
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate()
    stderr = seen + stderr
    assert proc.returncode == 130, stderr
    _assert_none_left(children)
    assert "stopping now" in stderr and "Traceback" not in stderr
    assert "<html" in out.read_text().lower()
    record = read_journal(_journal(tmp_path))
    assert record.status == "cancelled"
    fp32 = record.trial("fp32")
    assert fp32.status == "cancelled" and len(fp32.steps) >= 3
    assert [s.step for s in fp32.steps] == list(range(len(fp32.steps)))


def test_sigkill_of_the_cli_leaves_no_process_and_the_journal_reopens(tmp_path):
    proc = _start(tmp_path, "--precision", "fp32,bf16", "--steps", "500")
    children = _wait_for_steps(proc, tmp_path, 3)
    proc.kill()
    proc.communicate()
    _assert_none_left(children)  # the trial child ends with its parent (PR_SET_PDEATHSIG)
    journal = _journal(tmp_path)
    journaled = [s["step"] for s in _journal_steps(journal, "fp32")]
    assert len(journaled) >= 3 and journaled == list(range(len(journaled)))
    csv_out = tmp_path / "steps.csv"
    run = subprocess.run([sys.executable, "main.py", "report", str(journal), "--out",
                          str(csv_out)], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "(interrupted)" in run.stdout
    rows = csv_out.read_text().splitlines()
    assert len(rows) == 1 + len(journaled)
    record = read_journal(journal)
    assert record.status == "interrupted"
    assert record.trial("fp32").status == "cancelled"
    assert "interrupted" in record.trial("fp32").reason


def test_out_folder_deleted_during_the_run_costs_nothing(tmp_path):
    folder = tmp_path / "reports"
    folder.mkdir()
    out = folder / "r.json"
    proc = _start(tmp_path, "--precision", "fp32", "--steps", "6", "--isolation", "inline",
                  "--out", str(out))
    _wait_for_steps(proc, tmp_path, 1)
    shutil.rmtree(folder)
    stdout, stderr = proc.communicate()
    assert proc.returncode == 1
    journal = _journal(tmp_path)
    lines = [x for x in stderr.splitlines() if x.startswith("ampscope: error:")]
    assert len(lines) == 1 and str(out) in lines[0] and str(journal) in lines[0]
    assert "Traceback" not in stderr and "Precision" in stdout
    record = read_journal(journal)
    assert record.status == "ok" and len(record.trial("fp32").steps) == 7


def _tmpfs(path: Path, options: str) -> bool:
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True)
    return done.returncode == 0


@pytest.mark.parametrize("ending", ["read-only", "full"])
def test_out_folder_made_read_only_or_full_during_the_run(tmp_path, ending):
    folder = tmp_path / "mnt"
    if os.geteuid() == 0 and not _tmpfs(folder, "size=64k"):
        pytest.skip("running as root, where a read-only folder is still writable, and a "
                    "tmpfs cannot be mounted here (no CAP_SYS_ADMIN)")
    if os.geteuid() != 0:
        if ending == "full":
            pytest.skip("filling a folder needs a small tmpfs, and mounting one needs root")
        folder.mkdir()
    try:
        out = folder / "r.json"
        proc = _start(tmp_path, "--precision", "fp32", "--steps", "6", "--isolation",
                      "inline", "--out", str(out))
        _wait_for_steps(proc, tmp_path, 1)
        if ending == "read-only" and os.geteuid() == 0:
            subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        elif ending == "read-only":
            folder.chmod(0o500)
        else:
            _fill(folder)
        _, stderr = proc.communicate()
        assert proc.returncode == 1
        (line,) = [x for x in stderr.splitlines() if x.startswith("ampscope: error:")]
        assert str(_journal(tmp_path)) in line and "Traceback" not in stderr
        assert not [p for p in folder.iterdir() if p.name.startswith(".")]
        assert len(read_journal(_journal(tmp_path)).trial("fp32").steps) == 7
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(folder)], capture_output=True)
        else:
            folder.chmod(0o700)


def _fill(folder: Path) -> None:
    with open(folder / "filler", "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError:  # ENOSPC: the folder is full
            pass


def test_out_in_proc_is_refused_before_the_run(tmp_path):
    proc = _start(tmp_path, "--precision", "fp32", "--steps", "1", "--out", "/proc/x.json")
    _, stderr = proc.communicate()
    assert proc.returncode == 2
    assert stderr.count("\n") == 1 and "/proc" in stderr and "choose another --out" in stderr
    assert _journal(tmp_path) is None


def test_ctrl_c_during_the_numerics_lab_keeps_the_trials(tmp_path):
    out = tmp_path / "r.json"
    proc = _start(tmp_path, "--precision", "fp32", "--steps", "2", "--numerics", "--isolation",
                  "inline", "--out", str(out), new_session=True)
    line = ""
    while "numerics lab" not in line:
        line = proc.stderr.readline()
        assert line or proc.poll() is None, "the run ended before the lab started"
    lab = []
    while not lab:  # the message comes just before the lab's process starts
        assert proc.poll() is None
        lab = psutil.Process(proc.pid).children(recursive=True)
        time.sleep(POLL_S)
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate()
    assert proc.returncode == 130, stderr
    _assert_none_left(lab)
    assert "numerics lab stopped; the trials are kept" in stderr
    report = _report(out)
    assert report["numerics"] is None
    assert [t["status"] for t in report["trials"]] == ["ok"]
    assert len(report["trials"][0]["steps"]) == 3


def test_first_ctrl_c_waits_for_a_long_step_however_long(tmp_path):
    """A step that outlasts any grace period: the trial process is stopped (SIGSTOP) in the
    middle of its steps, as a step that takes minutes would be. The first Ctrl-C waits for
    it instead of ending the process; once the step goes on, the trial stops after it and
    its summary is kept."""
    out = tmp_path / "r.json"
    proc = _start(tmp_path, "--precision", "fp32", "--steps", "500", "--out", str(out),
                  new_session=True)
    children = _wait_for_steps(proc, tmp_path, 3)
    (trial,) = trial_processes(children)
    trial.suspend()
    try:
        os.killpg(proc.pid, signal.SIGINT)
        seen = _read_until(proc, "stopping after this step")  # the CLI took the Ctrl-C
        time.sleep(OUTLAST_S)
        assert proc.poll() is None and trial.is_running()
        assert trial.status() == psutil.STATUS_STOPPED
    finally:
        trial.resume()
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, seen + stderr
    _assert_none_left(children)
    (fp32,) = _report(out)["trials"]
    assert fp32["status"] == "cancelled" and "stopped by the user after" in fp32["reason"]
    assert "ended" not in fp32["reason"]  # not "the trial process was ended"
    journaled = [s["step"] for s in _journal_steps(_journal(tmp_path), "fp32")]
    measured = [s["step_ms"] for s in fp32["steps"] if not s["warmup"]]
    assert [s["step"] for s in fp32["steps"]] == journaled
    assert fp32["summary"]["median_step_ms"] == pytest.approx(
        sorted(measured)[len(measured) // 2] if len(measured) % 2 else
        sum(sorted(measured)[len(measured) // 2 - 1:len(measured) // 2 + 1]) / 2)
    assert fp32["dtype_map"] and fp32["memory"]["params_bytes"] > 0
