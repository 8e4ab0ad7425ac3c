"""Names the real CLI is given that are not what they should be (issue #46): ``watch`` on a
FIFO says what the path is (it exists: "journal not found" was wrong), and a 100,000-character
``--card`` is refused in one short line that does not echo it whole."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "main.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def _one_line(run: subprocess.CompletedProcess) -> str:
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    return run.stderr


def test_watch_names_a_fifo_as_one(tmp_path):
    fifo = tmp_path / "run.jsonl"
    os.mkfifo(fifo)
    line = _one_line(cli("watch", str(fifo)))
    assert f"{fifo} is a named pipe (FIFO), not a regular file" in line
    assert "not found" not in line


def test_report_names_a_fifo_the_same_way(tmp_path):
    fifo = tmp_path / "run.json"
    os.mkfifo(fifo)
    assert f"{fifo} is a named pipe (FIFO)" in _one_line(cli("report", str(fifo)))


def test_a_huge_card_name_is_not_echoed_whole():
    card = "Z" * 100_000
    line = _one_line(cli("plan", "--model", "tiny", "--card", card))
    assert "unknown card 'ZZZ" in line and "100,000 characters" in line
    assert len(line) < 2_000  # the card list it offers, not the name given
