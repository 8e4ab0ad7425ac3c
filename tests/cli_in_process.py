"""The command line run inside the test process: the parser and handler that a spawned
``main.py`` runs, without the ~5 s of interpreter start and imports each spawn costs.

For tests whose subject is a command's figures. What only a process shows (signals, exit
codes after a refusal made before imports, start-up noise, a child left behind) stays with
tests that spawn ``main.py``, and every subcommand keeps at least one of those.
"""

from __future__ import annotations

import contextlib
import io
import subprocess

import torch

from engine.cli.parser import main


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    """``main.py *argv`` in this process: its exit code, stdout and stderr, as
    ``subprocess.run(..., capture_output=True, text=True)`` returns them."""
    out, err = io.StringIO(), io.StringIO()
    # a trial seeds torch's global generator (a process of its own would not care)
    with torch.random.fork_rng(devices=[]), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        code = main(list(argv))
    return subprocess.CompletedProcess(["main.py", *argv], code, out.getvalue(), err.getvalue())
