"""pip install of the checkout: the packages, the data files and the ``ampscope`` command."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _install(tmp_path: Path) -> Path:
    # a copy of the tracked tree, so the build leaves nothing in the checkout
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                    "--quiet", "--target", str(target), str(src)], check=True,
                   capture_output=True)
    return target


def test_pip_install_lands_packages_resources_and_console_script(tmp_path):
    site = _install(tmp_path)
    packages = [p.parent.relative_to(ROOT) for top in ("ampscope", "engine", "gui")
                for p in (ROOT / top).rglob("__init__.py")]
    assert len(packages) >= 5
    for package in packages:  # every package of the checkout, new ones included
        assert (site / package / "__init__.py").is_file(), package
    for data in ("peak_flops.json", "presets.json", "report_template.html"):
        assert (site / "ampscope" / "resources" / data).is_file(), data
    assert not (site / "resources").exists()  # no top-level 'resources' package
    assert not (site / "tests").exists()
    env = {**os.environ, "PYTHONPATH": str(site)}
    work = tmp_path / "elsewhere"
    work.mkdir()
    # the entry point resolves to the same main as main.py, and the data files are found
    # inside the installed package (not in this checkout)
    probe = subprocess.run(
        [sys.executable, "-c",
         "import importlib.metadata as m, json, engine.core.resources as r,"
         " engine.measure.peaks as p;"
         "ep = [e for e in m.entry_points(group='console_scripts') if e.name == 'ampscope'][0];"
         "print(json.dumps([ep.value, ep.load().__module__, str(r.RESOURCES),"
         " len(p.table()['gpus'])]))"],
        cwd=work, env=env, capture_output=True, text=True, check=True)
    value, module, resources, gpus = json.loads(probe.stdout)
    assert value == "ampscope.cli:run" and module == "ampscope.cli"
    assert Path(resources) == site / "ampscope" / "resources"
    assert gpus > 0
    script = site / "bin" / "ampscope"
    out = subprocess.run([str(script), "presets", "--json"], cwd=work, env=env,
                         capture_output=True, text=True, check=True)
    names = [p["name"] for p in json.loads(out.stdout)]
    expected = subprocess.run([sys.executable, str(ROOT / "main.py"), "presets", "--json"],
                              capture_output=True, text=True, check=True)
    assert names == [p["name"] for p in json.loads(expected.stdout)] and "tiny" in names
    # the memory model's calibration is found inside the installed package too (it once
    # read the checkout's resources/ path: every trial of an installed AmpScope failed)
    calibrated = subprocess.run(
        [sys.executable, "-c", "import engine.models.memory_model as m;"
         "print(m.CALIBRATION); print(len(m.calibration()))"],
        cwd=work, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert Path(calibrated[0]) == site / "ampscope" / "resources" / "activation_calibration.json"
    assert int(calibrated[1]) > 0
