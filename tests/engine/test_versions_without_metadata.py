"""``main.py --version`` where the packages import but their metadata is absent, as in a
PyInstaller bundle that carried pyqtgraph's modules without its dist-info (issue #46: the
bundle said "pyqtgraph: not installed"). The real process runs with a sitecustomize that
hides every tested distribution from importlib.metadata (the modules still import): each
package is then reported with its module's own version, none as missing. transformers,
peft and accelerate read their own (and their dependencies') metadata when imported, so no
bundle runs without it (PyInstaller's hooks copy theirs): they keep theirs here.

The bundle itself is not built here (PyInstaller is not installed on the test machine);
pyinstaller.spec copies the same metadata with copy_metadata."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

from engine.core.versions import MODULES, TESTED

ROOT = Path(__file__).resolve().parents[2]
# the packages whose modules import without their metadata
HIDDEN = [d for d in MODULES if d not in ("transformers", "peft", "accelerate")]

HIDE = '''
import importlib.machinery, os, re

_HIDDEN = {re.sub(r"[-_.]+", "-", n).lower() for n in os.environ["HIDE_DISTS"].split(",")}
_find = importlib.machinery.PathFinder.find_distributions


def _visible(*args, **kwargs):
    for dist in _find(*args, **kwargs):
        if re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower() not in _HIDDEN:
            yield dist


importlib.machinery.PathFinder.find_distributions = _visible
'''


def test_version_reports_what_imports_without_metadata(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(HIDE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
           "HIDE_DISTS": ",".join(HIDDEN), "QT_QPA_PLATFORM": "offscreen"}
    hidden = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m\n"
         "try:\n    m.version('pyqtgraph')\nexcept m.PackageNotFoundError:\n    print('hidden')"],
        env=env, capture_output=True, text=True, timeout=120)
    assert hidden.stdout.strip() == "hidden", hidden.stderr  # the metadata really is gone
    run = subprocess.run([sys.executable, "main.py", "--version"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "not installed" not in run.stdout, run.stdout
    lines = {line.split(" ")[0].rstrip(":"): line for line in run.stdout.splitlines()[1:]}
    assert set(lines) == set(TESTED)
    # an independent answer: each module's own attribute, asked with the metadata hidden too
    asked = subprocess.run(
        [sys.executable, "-c", "import importlib, sys\nfor m in sys.argv[1:]:\n"
         "    print(getattr(importlib.import_module(m), '__version__', '') or '')",
         *(MODULES[d] for d in HIDDEN)], env=env, capture_output=True, text=True, timeout=300)
    for dist, version in zip(HIDDEN, asked.stdout.splitlines(), strict=True):
        expected = version if version[:1].isdigit() else "(version not recorded)"
        assert lines[dist].startswith(f"{dist} {expected} (tested"), lines[dist]
        if expected == version:  # the same release the metadata (visible here) names
            assert importlib.metadata.version(dist).split("+")[0] in version
    for dist in set(MODULES) - set(HIDDEN):
        assert lines[dist].startswith(f"{dist} {importlib.metadata.version(dist)} (tested")
