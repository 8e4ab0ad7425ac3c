"""A wrong ``--model`` or ``--out`` is refused by the real ``python3 main.py`` in one line
before torch, transformers or matplotlib load, in this process or a child it starts (the
trials' forkserver inherits ``-X importtime`` and the stderr pipe, so its imports would
show here too): a user's typo costs a fraction of a second, not seconds of imports."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "matplotlib")


def _refusal(args, tmp_path) -> tuple[list[str], set[str]]:
    """The lines ``main.py`` said (importtime lines left out) and the modules imported."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AMPSCOPE_DATA_DIR": str(tmp_path / "data")}
    run = subprocess.run([sys.executable, "-X", "importtime", "main.py", *args], cwd=ROOT,
                         text=True, capture_output=True, env=env, timeout=300)
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stdout == ""
    lines = run.stderr.splitlines()
    imported = {line.rsplit("|", 1)[1].strip() for line in lines
                if line.startswith("import time:") and "|" in line}
    assert "json" in imported  # importtime reached us: an empty set would prove nothing
    return [line for line in lines if not line.startswith("import time:")], imported


@pytest.mark.parametrize("command", ["profile", "plan", "footprint", "numerics", "fit"])
def test_a_model_folder_that_does_not_exist_is_refused_before_heavy_imports(command,
                                                                             tmp_path):
    missing = tmp_path / "no-such-model"
    said, imported = _refusal([command, "--model", str(missing)], tmp_path)
    assert said == [f"ampscope: error: model folder '{missing}' does not exist: check the "
                    "path, or pick a preset (python main.py presets)"]
    assert not imported & set(HEAVY), imported & set(HEAVY)


@pytest.mark.parametrize("command", ["profile", "numerics"])
def test_an_out_in_a_missing_folder_is_refused_before_heavy_imports(command, tmp_path):
    folder = tmp_path / "not-made"
    said, imported = _refusal([command, "--model", "tiny", "--out", str(folder / "r.json")],
                              tmp_path)
    assert said == [f"ampscope: error: folder {folder} does not exist: create it or choose "
                    "another --out"]
    assert not imported & set(HEAVY), imported & set(HEAVY)
    assert not folder.exists()  # nothing half-written


def test_an_out_with_an_unknown_extension_is_refused_before_heavy_imports(tmp_path):
    said, imported = _refusal(["profile", "--model", "tiny", "--out",
                               str(tmp_path / "r.txt")], tmp_path)
    assert said == ["ampscope: error: unknown report extension '.txt': use .json, .csv or "
                    ".html"]
    assert not imported & set(HEAVY), imported & set(HEAVY)
    assert list(tmp_path.glob("r*")) == []
