"""The window SIGKILLed while a trial trains in its child process leaves no process behind.

The window is started by its real entry point (``main.py`` with no arguments, offscreen)
in a process of its own; a timer in that process fills the Run form and presses Run
through the widgets, as a person would, with process isolation. Once the trial's child
journals steps, the window's process is SIGKILLed (no handler can run) and every process
it had must end.
"""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from tests.engine.test_run_endings import ROOT, _assert_none_left, _journal_steps
from tests.gui.window_process import window_driver, window_env

DRIVER = window_driver('RunConfig(model="tiny", precisions=("fp32",), batch_size=1, '
                       'seq_len=16, steps=100_000, warmup=0, device="cpu", isolation="process")')


def test_sigkill_of_the_window_during_a_trial_leaves_no_child(tmp_path):
    env = window_env(tmp_path)
    with open(tmp_path / "window.log", "wb") as log:  # a pipe would wait for orphans
        proc = subprocess.Popen([sys.executable, "-c", DRIVER], cwd=ROOT, env=env,
                                stdout=log, stderr=subprocess.STDOUT)
    runs = tmp_path / "data" / "runs"
    deadline = time.monotonic() + 600
    while True:
        assert proc.poll() is None, (tmp_path / "window.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "the trial never journaled a step"
        found = psutil.Process(proc.pid).children(recursive=True)
        journals = list(runs.glob("*.jsonl"))
        trial = [p for p in found if "spawn_main" in " ".join(_cmdline(p))]
        if trial and journals and _journal_steps(journals[0]):
            break
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    _assert_none_left(found)


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []

