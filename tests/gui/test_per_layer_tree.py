"""The Model tab of a per-layer recipe's report marks which layers ran in what."""

import os
import subprocess
import sys
from pathlib import Path

from gui.main_window import MainWindow
from gui.model_view import SORT_ROLE
from tests.gui.clicks import RUN_TIMEOUT_MS

ROOT = Path(__file__).resolve().parents[2]


def _marks(model) -> dict[str, str]:
    """Full module name -> its Marks cell, over the whole tree."""
    found, stack = {}, [model.invisibleRootItem()]
    while stack:
        parent = stack.pop()
        for r in range(parent.rowCount()):
            found[parent.child(r, 0).data(SORT_ROLE)] = parent.child(r, 4).text()
            stack.append(parent.child(r, 0))
    return found


def test_the_model_tab_shows_the_kept_attention_in_bf16(qtbot, tmp_path):
    out = tmp_path / "r.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AMPSCOPE_DATA_DIR": str(tmp_path / "data")}
    run = subprocess.run(
        [sys.executable, "main.py", "profile", "--model", "tiny", "--precision",
         "fp8:keep-attn", "--batch-size", "1", "--seq-len", "16", "--steps", "1",
         "--warmup", "0", "--device", "cpu", "--isolation", "inline", "--quiet",
         "--no-kernel-profile", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    window = MainWindow()
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.record_shown, timeout=RUN_TIMEOUT_MS):
        assert window.open_report(out)
    (trial,) = window.record.trials
    blocks = {m.name for m in trial.module_tree if m.name.count(".") == 2
              and m.name.startswith("transformer.h.")}
    assert blocks
    marks = _marks(window.model_view.modules)
    for block in blocks:
        assert marks[f"{block}.attn"] == "matmuls in bf16"
        assert marks[f"{block}.attn.c_attn"] == marks[f"{block}.attn.c_proj"] == "matmuls in bf16"
        assert marks[f"{block}.mlp"] == "matmuls in fp8"
        assert marks[f"{block}.mlp.c_fc"] == marks[f"{block}.mlp.c_proj"] == "matmuls in fp8"
        assert marks[block] == "matmuls in bf16, fp8"
    assert marks["lm_head"] == "matmuls in bf16, weight tied to transformer.wte.weight"
    assert marks[""] == "matmuls in bf16, fp8"
