"""The window started by its real entry point (``main.py`` with no arguments, offscreen) in a
process of its own, with a timer that fills the Run form and presses Run as a person would."""

from __future__ import annotations

import os
from pathlib import Path

# {config}: a RunConfig expression; {on_run}: statements run just before Run is clicked
_DRIVER = """
import sys
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from ampscope.cli import run
from engine.core.config import RunConfig
from tests.gui.clicks import click, fill_form

CONFIG = {config}
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
{on_run}
    click(window.run_button)


QTimer.singleShot(0, press_run)
sys.argv = ["main.py"]
run()
"""


def window_driver(config: str, on_run: str = "") -> str:
    """Python source for ``python -c``: the window, and Run pressed with ``config``."""
    body = "\n".join("    " + line for line in on_run.splitlines())
    return _DRIVER.format(config=config, on_run=body)


def window_env(tmp_path: Path) -> dict:
    """The window's environment: its data and settings in ``tmp_path``, offscreen."""
    return dict(os.environ, AMPSCOPE_DATA_DIR=str(tmp_path / "data"), OMP_NUM_THREADS="1",
                QT_QPA_PLATFORM="offscreen", XDG_CONFIG_HOME=str(tmp_path / "cfg"))
