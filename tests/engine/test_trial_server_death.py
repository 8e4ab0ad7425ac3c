"""The CPU trials' forkserver killed mid-trial, on the real CLI process: the trial's reason
names the server's death (not "exited with code 255 ... a native crash?"), the steps it
measured before are kept in the report, and the run ends with its report written."""

from __future__ import annotations

import json
import signal
import subprocess

import psutil

from engine.run.trial_process import start_method
from tests.engine.test_run_endings import _journal, _journal_steps, _start, _wait_for_steps


def test_a_killed_trial_server_is_named_and_the_steps_are_kept(tmp_path):
    assert start_method("cpu") == "forkserver"
    out = tmp_path / "r.json"
    proc = _start(tmp_path, "--precision", "fp32", "--steps", "500", "--out", str(out))
    children = _wait_for_steps(proc, tmp_path, 3)
    (server,) = [p for p in children if p.ppid() == proc.pid
                 and "forkserver" in " ".join(p.cmdline())]
    server.send_signal(signal.SIGKILL)
    try:
        stdout, stderr = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    psutil.wait_procs(children, timeout=30)
    (trial,) = json.loads(out.read_text())["trials"]
    assert trial["status"] == "error"
    assert trial["reason"].startswith("the trial server process was killed (SIGKILL) during "
                                      "the trial"), trial["reason"]
    assert "native crash" not in trial["reason"]
    journaled = [s["step"] for s in _journal_steps(_journal(tmp_path), "fp32")]
    assert len(journaled) >= 3
    assert [s["step"] for s in trial["steps"]] == journaled
    assert "trial server process was killed" in stdout + stderr
