"""Through the real ``python3 main.py`` processes: a profile whose fp32 trial raises says the
one-line reason and where the traceback is; ``report FILE`` lists the trial with that line
and the command to see more, and the command it names prints the traceback."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.raising_model import MESSAGE, raising_model_folder

ROOT = Path(__file__).resolve().parents[2]


def _main(*args: str, env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "main.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    root = tmp_path_factory.mktemp("traceback")
    env = {**os.environ, "HF_HOME": str(root / "hf"), "AMPSCOPE_DATA_DIR": str(root / "data")}
    out = root / "run.json"
    proc = _main("profile", "--model", str(raising_model_folder(root)), "--trust-remote-code",
                 "--precision", "fp32", "--batch-size", "1", "--seq-len", "16", "--steps", "1",
                 "--warmup", "0", "--device", "cpu", "--isolation", "inline",
                 "--no-kernel-profile", "--no-quant-error", "--quiet", "--out", str(out),
                 env=env, timeout=1200)
    return proc, out, env


def test_profile_says_the_reason_and_where_the_traceback_is(profiled):
    proc, out, _env = profiled
    assert proc.returncode == 1, proc.stderr
    assert f"fp32: {MESSAGE}" in proc.stdout  # the table's one line
    assert "Traceback (most recent" not in proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last == ("1 of 1 trials failed: see the reasons above (tracebacks: "
                    f"python main.py report {out} --traceback)")


def test_the_command_named_prints_the_traceback_and_report_alone_one_line(profiled):
    proc, out, env = profiled
    command = proc.stderr.strip().splitlines()[-1].split("(tracebacks: ")[1].rstrip(")")
    shown = _main(*shlex.split(command)[2:], env=env)  # as typed, after "python main.py"
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[1] == f"  fp32: error: {MESSAGE}"
    trace = "\n".join(lines[2:])
    assert trace.startswith("Traceback (most recent call last):")
    assert 'raising_model.py", line' in trace and ", in broken_block" in trace
    assert trace.endswith(MESSAGE)
    brief = _main("report", str(out), env=env)
    assert brief.returncode == 0, brief.stderr
    assert brief.stdout.splitlines()[1] == (f"  fp32: error: {MESSAGE} (traceback: "
                                            f"python main.py report {out} --traceback)")
    assert "Traceback (most recent" not in brief.stdout
    assert "--traceback" in _main("report", "--help", env=env).stdout
