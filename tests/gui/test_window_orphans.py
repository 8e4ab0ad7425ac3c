"""The window SIGKILLed while a trial trains in its child process leaves no process behind.

The window is started by its real entry point (``main.py`` with no arguments, offscreen)
in a process of its own; a timer in that process fills the Run form and presses Run
through the widgets, as a person would, with process isolation. Once the trial's child
journals steps, the window's process is SIGKILLed (no handler can run) and every process
it had must end.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time

import psutil

from tests.engine.test_run_endings import (
    ROOT,
    _assert_none_left,
    _journal_steps,
    trial_processes,
)
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
    try:
        while True:
            log_tail = (tmp_path / "window.log").read_text()[-3000:]
            assert proc.poll() is None, log_tail
            assert time.monotonic() < deadline, f"the trial never journaled a step: {log_tail}"
            found = psutil.Process(proc.pid).children(recursive=True)
            journals = list(runs.glob("*.jsonl"))
            trial = trial_processes(found)
            if trial and journals and _journal_steps(journals[0]):
                break
            time.sleep(0.2)
    except BaseException:  # a failed wait leaves no window running after the test
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
        proc.kill()
        raise
    proc.kill()
    proc.wait()
    _assert_none_left(found)

