"""History lists how each run ended as the CLI said it: a real CLI run whose only trial ran
out of memory (exit 1, "1 of 1 trials failed") is not listed "ok"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from PySide6.QtCore import Qt

from gui.main_window import MainWindow
from tests.gui.clicks import click_tab

ROOT = Path(__file__).resolve().parents[2]
# the CLI's process with its address space capped 1 GiB above what it has mapped once
# torch is loaded: gpt2's fp32 weights, gradients and AdamW state need more
LIMITED = (
    "import resource, runpy, sys, psutil, torch, transformers\n"
    "limit = psutil.Process().memory_info().vms + 1024**3\n"
    "resource.setrlimit(resource.RLIMIT_AS, (limit, limit))\n"
    "sys.argv = ['main.py', *sys.argv[1:]]\n"
    "runpy.run_path('main.py', run_name='__main__')\n"
)


def test_a_cli_run_whose_only_trial_ran_out_of_memory_is_listed_as_failed(qtbot):
    cli = subprocess.run(
        [sys.executable, "-c", LIMITED, "profile", "--model", "gpt2", "--precision", "fp32",
         "--device", "cpu", "--batch-size", "1", "--seq-len", "16", "--steps", "1",
         "--warmup", "0", "--isolation", "inline", "--quiet"],
        cwd=ROOT, capture_output=True, text=True)
    assert cli.returncode == 1, cli.stdout + cli.stderr
    assert "1 of 1 trials failed" in cli.stdout + cli.stderr

    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    click_tab(window.tabs, "History")
    tree = window.history_view.tree
    assert tree.topLevelItemCount() == 1
    row = tree.topLevelItem(0)
    status = row.text(tree.columnCount() - 1)
    assert status == "1 of 1 trials failed (oom)", status
    # the column shows it whole
    tree.resizeColumnToContents(tree.columnCount() - 1)
    rect = tree.visualItemRect(row)
    assert tree.columnWidth(tree.columnCount() - 1) >= tree.fontMetrics().horizontalAdvance(
        status), rect
    assert row.data(0, Qt.ItemDataRole.DisplayRole)  # the run id beside it
