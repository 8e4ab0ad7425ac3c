"""The window's terminal stays quiet: a run started from the window prints none of torchao's
and torch's start-up notices (the CLI's test is tests/engine/test_quiet_startup.py).

The window runs by its real entry point in a process of its own (tests/gui/window_process.py);
the process quits once the run has finished.
"""

from __future__ import annotations

import subprocess
import sys

from tests.engine.test_quiet_startup import NOISE
from tests.engine.test_run_endings import ROOT
from tests.gui.window_process import window_driver, window_env

DRIVER = window_driver(
    'RunConfig(model="tiny", precisions=("fp32",), batch_size=1, seq_len=16, steps=2, '
    'warmup=0, device="cpu", isolation="inline")',
    'window.worker.finished.connect(lambda record: (print("RUN ENDED", flush=True), '
    'app.quit()))')


def test_a_run_from_the_window_prints_no_library_start_up_noise(tmp_path):
    env = window_env(tmp_path)
    out = subprocess.run([sys.executable, "-c", DRIVER], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=900)
    assert "RUN ENDED" in out.stdout, out.stderr[-3000:]
    for noise in NOISE:
        assert noise not in out.stderr, out.stderr[-3000:]
