"""A script that opens the window and ends while the window's device probe is still
importing the engine: it ends quietly, with no "RuntimeError: can't register atexit after
shutdown" over its last lines. The script runs in its own Python process; the engine's
import (transformers, after the probe's answer) is held until the process is ending, then
imports a module that registers an exit hook, as concurrent.futures.thread does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = '''
import atexit, importlib, os, sys, threading, time
sys.path.insert(0, {root!r})
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication
QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, {scratch!r})
app = QApplication([])
import engine.models.hf as hf
loading = threading.Event()
real = hf.load_transformers

def load_transformers():  # the probe thread's warm-up, held until the process ends
    loading.set()
    while not threading._SHUTTING_DOWN:
        time.sleep(0.01)
    sys.modules.pop("concurrent.futures.thread", None)
    importlib.import_module("concurrent.futures.thread")
    return real()

hf.load_transformers = load_transformers
from gui.main_window import MainWindow
window = MainWindow()
window.show()
while not loading.is_set():
    app.processEvents()
atexit.register(time.sleep, 0.5)  # the rest of the exit's work: the thread runs meanwhile
print("leaving while the engine imports", flush=True)
'''


def test_a_script_ending_while_the_window_imports_ends_quietly(tmp_path):
    script = tmp_path / "open_and_leave.py"
    script.write_text(SCRIPT.format(root=str(ROOT), scratch=str(tmp_path / "cfg")))
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen",
           "AMPSCOPE_DATA_DIR": str(tmp_path / "data")}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "leaving while the engine imports" in done.stdout
    assert "Traceback" not in done.stderr and "atexit" not in done.stderr, done.stderr
