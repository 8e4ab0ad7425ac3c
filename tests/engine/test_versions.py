"""The tested range of versions: declared by the package, checked at start-up, said once.

The out-of-range case is made real for the process under test: a distribution's metadata
(`torch-2.99.0.dist-info`) placed first on its path, as an environment holding torch 2.99
would present it; torch itself still imports from the real installation.
"""

from __future__ import annotations

import importlib.metadata
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine.core import versions

ROOT = Path(__file__).resolve().parents[2]
MAIN = str(ROOT / "main.py")


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)==([^\s#]+)", line)
        if match:
            pins[match.group(1)] = match.group(2)
    return pins


def _fake_distribution(folder: Path, name: str, version: str) -> Path:
    info = folder / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return folder


def test_pyproject_declares_the_ranges_the_start_up_check_tests():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["window"]
    ranges = {}
    for spec in declared:
        name, rest = re.match(r"([A-Za-z0-9_.-]+)(.*)", spec).groups()
        ranges[name] = rest
    for name, (low, high, _) in versions.TESTED.items():
        if name == "python":
            assert project["requires-python"] == f">={low}"
            continue
        upper = high.split(".")
        upper[-1] = str(int(upper[-1]) + 1)  # "2.13" -> below 2.14
        assert ranges[name] == f">={low},<{'.'.join(upper)}", name


def test_the_readme_installs_the_newest_end_and_the_oldest_run_the_oldest():
    newest, oldest = _pins(ROOT / "requirements.txt"), _pins(ROOT / "requirements-oldest.txt")
    for name, (low, high, _) in versions.TESTED.items():
        if name == "python":
            continue
        assert newest[name].startswith(high + "."), (name, newest[name], high)
        if name in oldest:
            assert oldest[name].startswith(low + "."), (name, oldest[name], low)
    assert oldest["torch"] == "2.11.0" and oldest["transformers"] == "5.17.0"


def test_version_lists_python_and_every_library_against_its_range():
    out = subprocess.run([sys.executable, MAIN, "--version"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("AmpScope ")
    assert f"python {platform.python_version()} (tested 3.10-3.12)" in lines
    for name in ("torch", "transformers", "torchao", "bitsandbytes"):
        have = importlib.metadata.version(name)
        assert any(line.startswith(f"{name} {have} (tested ") for line in lines), (name, lines)
    assert "OUTSIDE" not in out.stdout  # this machine runs the pinned set


def test_a_library_outside_the_range_is_said_once_and_the_command_goes_on(tmp_path):
    site = _fake_distribution(tmp_path, "torch", "2.99.0")
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, MAIN, "presets", "--json"], capture_output=True,
                         text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    said = [line for line in out.stderr.splitlines() if "tested versions" in line]
    assert len(said) == 1, out.stderr
    assert "torch 2.99.0 (tested 2.11-2.13; affects every measurement" in said[0]
    assert "tiny" in out.stdout  # the command went on
    listed = subprocess.run([sys.executable, MAIN, "--version"], capture_output=True,
                            text=True, timeout=120, env=env).stdout
    assert "torch 2.99.0 (tested 2.11-2.13)  OUTSIDE the tested 2.11-2.13" in listed


def test_release_prefixes_compare_as_numbers():
    check = versions.VersionCheck("torch", "2.11.0+cu130", "2.11", "2.13", "x")
    assert check.in_range
    assert not versions.VersionCheck("torch", "2.9.1", "2.11", "2.13", "x").in_range
    assert not versions.VersionCheck("torch", "2.14.0.dev20261101", "2.11", "2.13", "x").in_range
    assert versions.VersionCheck("python", "3.12.1", "3.10", "3.12", "x").in_range
    assert not versions.VersionCheck("peft", None, "0.21", "0.21", "x").in_range
