"""Trial processes end without leaking the named semaphores a library made in them: on an
H200, each of 10 trials left one and the resource tracker warned "10 leaked semaphore
objects" when the run ended (the child's os._exit skipped multiprocessing's finalisers)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


SITECUSTOMIZE = """
import sys
from importlib.abc import MetaPathFinder


class _SpawnLockOnTrialImport(MetaPathFinder):
    locks = []  # kept alive: a library's lock lives as long as its module

    def find_spec(self, name, path, target=None):
        if name == "engine.run.trial" and not self.locks:
            import multiprocessing

            self.locks.append(multiprocessing.get_context("spawn").Lock())
        return None


sys.meta_path.insert(0, _SpawnLockOnTrialImport())
"""


def test_a_multi_trial_run_leaves_no_leaked_semaphore(tmp_path):
    # each trial process makes a named semaphore as it imports the trial code, as a library
    # using a spawn context does (a fork-context lock is unlinked at once and never tracked);
    # it registers with the resource tracker the run's processes share
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    proc = subprocess.run(
        [sys.executable, "main.py", "profile", "--model", "tiny", "--batch-size", "1",
         "--seq-len", "16", "--steps", "1", "--warmup", "1", "--device", "cpu",
         "--precision", "fp32,bf16-amp,fp16-amp", "--isolation", "process",
         "--interleave", "off", "--no-kernel-profile", "--quiet"],
        cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "ok" in proc.stdout
    assert "resource_tracker" not in proc.stderr, proc.stderr
    assert "leaked" not in proc.stderr
