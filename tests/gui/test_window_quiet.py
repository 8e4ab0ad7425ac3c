"""The window's terminal stays quiet: a run started from the window prints none of torchao's
and torch's start-up notices (the CLI's test is tests/engine/test_quiet_startup.py).

The window runs by its real entry point in a process of its own, with a timer that fills the
Run form and presses Run as a person would; the process quits once the run has finished.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.engine.test_quiet_startup import NOISE
from tests.engine.test_run_endings import ROOT

DRIVER = """
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from ampscope.cli import run
from engine.core.config import RunConfig
from tests.gui.clicks import click, fill_form

CONFIG = RunConfig(model="tiny", precisions=("fp32",), batch_size=1, seq_len=16, steps=2,
                   warmup=0, device="cpu", isolation="inline")
app = QApplication(["main.py"])


def press_run():
    window = next((w for w in app.topLevelWidgets() if type(w).__name__ == "MainWindow"
                   and w.isVisible()), None)
    if window is None or window.config_panel.device_pending():
        QTimer.singleShot(50, press_run)
        return
    fill_form(window, CONFIG)
    window.worker.finished.connect(lambda record: (print("RUN ENDED", flush=True), app.quit()))
    click(window.run_button)


QTimer.singleShot(0, press_run)
import sys
sys.argv = ["main.py"]
run()
"""


def test_a_run_from_the_window_prints_no_library_start_up_noise(tmp_path):
    env = dict(os.environ, AMPSCOPE_DATA_DIR=str(tmp_path / "data"), OMP_NUM_THREADS="1",
               QT_QPA_PLATFORM="offscreen", XDG_CONFIG_HOME=str(tmp_path / "cfg"))
    out = subprocess.run([sys.executable, "-c", DRIVER], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=900)
    assert "RUN ENDED" in out.stdout, out.stderr[-3000:]
    for noise in NOISE:
        assert noise not in out.stderr, out.stderr[-3000:]
