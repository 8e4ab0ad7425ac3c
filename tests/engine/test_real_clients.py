"""nanoGPT's own train.py with the Recorder added: every journaled figure is its own (#45).

Runs ``benchmarks/real_clients.py --only nanogpt``, which patches a temporary copy of the
clone named by AMPSCOPE_NANOGPT (``git clone https://github.com/karpathy/nanoGPT``) and
compares each figure with the values train.py itself computed.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLONE = os.environ.get("AMPSCOPE_NANOGPT")


@pytest.mark.skipif(not CLONE, reason="set AMPSCOPE_NANOGPT to a clone of "
                    "github.com/karpathy/nanoGPT to run its train.py with the Recorder")
def test_nanogpts_train_py_is_journaled_exactly(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "real_clients.py"), "--nanogpt", CLONE,
         "--only", "nanogpt"], capture_output=True, text=True,
        env=dict(os.environ, AMPSCOPE_DATA_DIR=str(tmp_path)))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    rows = [line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("nanogpt")]
    figures = {" ".join(r[:-2]) if r[0] != "precision" else "precision" for r in rows}
    assert {"loss", "lr group 0", "lr group 1", "grad norm (pre-clip)", "tokens",
            "precision"} <= figures
    # seven steps (iterations 0..6) compared for each numeric figure
    assert all(r[-2] == "7" for r in rows if r[0] != "precision")
