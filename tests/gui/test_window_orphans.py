"""The window SIGKILLed while a trial trains in its child process leaves no process behind.

The window is started by its real entry point (``main.py`` with no arguments, offscreen)
in a process of its own; a timer in that process fills the Run form and presses Run
through the widgets, as a person would, with process isolation. Once the trial's child
journals steps, the window's process is SIGKILLed (no handler can run) and every process
it had must end.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from tests.engine.test_run_endings import ROOT, _assert_none_left, _journal_steps

# the window's own entry point, after a timer that presses Run once the window is up
DRIVER = """
import sys
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from ampscope.cli import run
from engine.core.config import RunConfig
from tests.gui.clicks import click, fill_form

CONFIG = RunConfig(model="tiny", precisions=("fp32",), batch_size=1, seq_len=16,
                   steps=100_000, warmup=0, device="cpu", isolation="process")
app = QApplication(["main.py"])


def press_run():
    window = next((w for w in app.topLevelWidgets() if type(w).__name__ == "MainWindow"
                   and w.isVisible()), None)
    # as the other window tests (tests/gui/conftest.py) and a person do: the form is filled
    # once the window says what the device is (filled while the first probe was still out,
    # on a loaded machine, Run was once found disabled when clicked)
    if window is None or window.config_panel.device_pending():
        QTimer.singleShot(50, press_run)
        return
    fill_form(window, CONFIG)
    click(window.run_button)


QTimer.singleShot(0, press_run)
sys.argv = ["main.py"]
run()
"""


def test_sigkill_of_the_window_during_a_trial_leaves_no_child(tmp_path):
    env = dict(os.environ, AMPSCOPE_DATA_DIR=str(tmp_path / "data"), OMP_NUM_THREADS="1",
               QT_QPA_PLATFORM="offscreen", XDG_CONFIG_HOME=str(tmp_path / "cfg"))
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

