"""The float8 recipes (tensorwise, rowwise, rowwise with a high-precision weight gradient)
run through a real inline CPU trial and report the scaling torchao's config prescribes."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from torchao.float8 import Float8LinearConfig
from torchao.float8.config import Float8LinearRecipeName
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.pytorch_utils import Conv1D

from engine.core.config import RunConfig
from engine.core.recipes import RECIPES
from engine.core.resources import RESOURCES
from engine.measure.device import probe
from engine.run.trial import run_trial
from tests.engine.float8_cpu import rowwise_runs_on_cpu

ROOT = Path(__file__).resolve().parents[2]
# torchao float8 runs on the CPU through torch._scaled_mm: emulated, uncompiled
CPU = probe("cpu")

PRESETS = {p["name"]: p["config"] for p in
           json.loads((RESOURCES / "presets.json").read_text())["presets"]}

# the GEMM each Float8LinearConfig cast config feeds, as torchao's float8_linear uses them
CASTS = {
    ("output", "input"): "cast_config_input",
    ("output", "weight"): "cast_config_weight",
    ("grad-input", "grad_output"): "cast_config_grad_output",
    ("grad-input", "weight"): "cast_config_weight_for_grad_input",
    ("grad-weight", "input"): "cast_config_input_for_grad_weight",
    ("grad-weight", "grad_output"): "cast_config_grad_output_for_grad_weight",
}


def _reported(note: str) -> dict:
    """{(gemm, operand): (granularity or "high precision", dtype or None)} from a note."""
    found = {}
    for gemm, body in re.findall(r"([\w-]+) GEMM: ([^;]+)", note):
        for part in body.split(", "):
            words = part.split()
            if words[1:] == ["high", "precision"]:
                found[(gemm, words[0])] = ("high precision", None)
            else:
                found[(gemm, words[0])] = (words[1], words[2])
    return found


@pytest.mark.parametrize(("precision", "torchao_recipe"), [
    ("fp8", Float8LinearRecipeName.TENSORWISE),
    ("fp8-rowwise", Float8LinearRecipeName.ROWWISE),
    ("fp8-rowwise-gw-hp", Float8LinearRecipeName.ROWWISE_WITH_GW_HP),
])
def test_float8_recipe_trains_and_reports_torchaos_scaling(precision, torchao_recipe):
    config = RunConfig(model="tiny", precisions=(precision,), batch_size=1, seq_len=16,
                       steps=2, warmup=0, device="cpu", isolation="inline")
    result = run_trial(config, precision, CPU, lambda e: None, lambda: False)
    if torchao_recipe != Float8LinearRecipeName.TENSORWISE and not rowwise_runs_on_cpu():
        # torch 2.11: the CPU _scaled_mm takes per-tensor scales only; the trial is refused
        # before it loads anything, with that reason (the window greys it out with it)
        assert result.status == "unsupported"
        assert "per-tensor scales only" in result.reason and "choose fp8" in result.reason
        assert CPU.verdict(precision).support == "unsupported"
        return
    assert result.status == "ok", result.reason
    assert result.support == "emulated"
    assert math.isfinite(result.summary.final_loss)
    (note,) = [n for n in result.notes if n.startswith("float8 scaling")]
    expected_cfg = Float8LinearConfig.from_recipe_name(torchao_recipe)
    expected = {}
    for key, attr in CASTS.items():
        cast = getattr(expected_cfg, attr)
        if cast.scaling_type.name == "DISABLED":
            expected[key] = ("high precision", None)
        else:
            expected[key] = (cast.scaling_granularity.name.lower(),
                             str(cast.target_dtype).split(".")[-1])
    assert _reported(note) == expected
    assert ("powers of 2" in note) == expected_cfg.round_scales_to_power_of_2
    # every GPT-2 block projection (Conv1D) is converted; the tied lm_head stays bf16
    gpt2 = GPT2LMHeadModel(GPT2Config(**PRESETS["tiny"]))
    projections = sum(isinstance(m, Conv1D) for m in gpt2.modules())
    assert re.search(r"of (\d+) Linear layers", note).group(1) == str(projections)
    assert RECIPES[precision].peak_dtype == "fp8"


def test_rowwise_recipes_differ_from_tensorwise_where_torchao_says():
    rowwise = Float8LinearConfig.from_recipe_name(Float8LinearRecipeName.ROWWISE)
    assert rowwise.cast_config_input.scaling_granularity.name == "AXISWISE"
    gw_hp = Float8LinearConfig.from_recipe_name(Float8LinearRecipeName.ROWWISE_WITH_GW_HP)
    assert gw_hp.cast_config_input_for_grad_weight.scaling_type.name == "DISABLED"
    assert RECIPES["fp8-rowwise"].float8_recipe == Float8LinearRecipeName.ROWWISE.value
    assert RECIPES["fp8-rowwise-gw-hp"].float8_recipe == (
        Float8LinearRecipeName.ROWWISE_WITH_GW_HP.value)


def test_profile_runs_rowwise_on_the_cpu_or_says_why_not(tmp_path):
    """`profile --precision fp8-rowwise` on the CPU: a torch whose CPU _scaled_mm takes row
    scales trains it; torch 2.11's refuses it before loading, and the table and the report
    say n/a with torch's reason."""
    out = tmp_path / "r.json"
    run = subprocess.run(
        [sys.executable, "main.py", "profile", "--model", "tiny", "--precision", "fp8-rowwise",
         "--batch-size", "1", "--seq-len", "16", "--steps", "1", "--warmup", "0", "--device",
         "cpu", "--isolation", "inline", "--no-kernel-profile", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, check=False,
        env={**os.environ, "AMPSCOPE_DATA_DIR": str(tmp_path / "data"),
             "AMPSCOPE_CACHE_DIR": str(tmp_path / "cache")})
    assert run.returncode == 0, run.stdout + run.stderr
    (trial,) = json.loads(out.read_text())["trials"]
    if rowwise_runs_on_cpu():
        assert trial["status"] == "ok", trial.get("reason")
        return
    assert trial["status"] == "unsupported"
    assert "per-tensor scales only" in trial["reason"]
    row = next(line for line in run.stdout.splitlines() if line.startswith("fp8-rowwise "))
    assert row.split()[1] == "unsupported"
    assert "fp8-rowwise: n/a on the CPU: torch" in run.stdout
