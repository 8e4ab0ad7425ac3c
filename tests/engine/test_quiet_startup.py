"""Start-up is quiet and honest: torchao's compile-time warnings and extension-load notices
do not reach the terminal, and the one that means a feature is missing reaches the gating.

torchao is copied without its bytecode ahead of the installed one, so Python compiles it
anew, as on a fresh or read-only install (the first GPU machine printed torchao's
SyntaxWarning at every start: Python 3.12; 3.10-3.11 raise it as a DeprecationWarning,
which ``-W default`` shows).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from engine.measure import gating
from engine.measure.device import torchao_extension_failures, with_extension_notes

ROOT = Path(__file__).resolve().parents[2]
NOISE = ("invalid escape sequence", "Failed to load", "register_constant")


def _fresh_torchao(tmp_path: Path) -> dict:
    source = Path(importlib.util.find_spec("torchao").origin).parent
    shutil.copytree(source, tmp_path / "torchao",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}


def test_an_fp8_command_prints_none_of_torchaos_start_up_noise(tmp_path):
    env = _fresh_torchao(tmp_path)
    bare = subprocess.run([sys.executable, "-W", "default", "-c", "import torchao.quantization"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert "invalid escape sequence" in bare.stderr  # the noise is there to be silenced
    out = subprocess.run([sys.executable, "-W", "default", str(ROOT / "main.py"), "footprint",
                          "--model", "tiny", "--precision", "fp8"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "fp8" in out.stdout
    for noise in NOISE:
        assert noise not in out.stderr, out.stderr


def test_a_native_mxfp8_verdict_names_the_extension_that_did_not_load():
    failures = torchao_extension_failures()  # this machine's torchao: built for other Pythons
    b200 = gating.DeviceDescription(kind="cuda", name="NVIDIA B200", compute_capability=(10, 0))
    verdicts = gating.matrix(b200)
    assert verdicts["mxfp8"].support == "native"
    noted = with_extension_notes(verdicts, failures)
    if any("_C_mxfp8" in f for f in failures):
        assert "torchao's compiled MXFP8 extension did not load" in noted["mxfp8"].reason
        assert noted["mxfp8"].support == "native"
    else:
        assert noted == verdicts
    assert noted["fp8"] == verdicts["fp8"]  # only the recipe that needs it
    h200 = gating.matrix(gating.DeviceDescription(kind="cuda", name="NVIDIA H200",
                                                  compute_capability=(9, 0)))
    assert with_extension_notes(h200, failures)["mxfp8"] == h200["mxfp8"]  # emulated anyway
