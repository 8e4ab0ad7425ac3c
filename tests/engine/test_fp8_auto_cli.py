"""`profile --precision fp8:auto --card H20` through the real CLI on two model families: the
layers that ran float8 are exactly those the payoff model predicts to pay at the trial's
shape on that card, found here from the model's own Linear layers; on the CPU an ':auto'
recipe without a card is refused with one line and exit 2."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers as tf
from transformers.pytorch_utils import Conv1D

from engine.measure.fp8_payoff import RECIPES, Layer, layer_payoff
from engine.measure.peaks import memory_bandwidth, peak_flops
from tests.cli_in_process import run_cli
from tests.engine.families import FAMILIES

ROOT = Path(__file__).resolve().parents[2]
CARD = "NVIDIA H20"  # its low bf16 peak beside its bandwidth: GEMMs this small can pay
BATCH, SEQ = 2, 256
# one block, wide enough that some layers pay at 512 tokens on an H20 and some do not
WIDE = {
    "llama-gqa": dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=1,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                      max_position_embeddings=SEQ),
    "gpt2": dict(n_embd=1024, n_inner=4096, n_layer=1, n_head=8, n_positions=SEQ),
}


def _env(tmp_path):
    return {**os.environ, "AMPSCOPE_DATA_DIR": str(tmp_path / "data"),
            "AMPSCOPE_CACHE_DIR": str(tmp_path / "cache")}


def _folder(family, tmp_path) -> Path:
    config = FAMILIES[family]()
    config.update(WIDE[family])
    config.save_pretrained(tmp_path / family)
    return tmp_path / family


def _expected(folder: Path, label: str) -> dict[str, bool]:
    """Each convertible Linear layer (GPT-2's Conv1D stores (in, out)) -> whether it pays."""
    config = tf.AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = tf.AutoModelForCausalLM.from_config(config)
    recipe = next(r for r in RECIPES if r.label == label)
    bf16, low = peak_flops(CARD, "bf16").flops_per_s, peak_flops(CARD, "fp8").flops_per_s
    bw = memory_bandwidth(CARD).bytes_per_s
    pays = {}
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and "lm_head" not in name:
            k, n = mod.in_features, mod.out_features
        elif isinstance(mod, Conv1D):
            k, n = mod.weight.shape
        else:
            continue
        pays[name] = layer_payoff(Layer(name, BATCH * SEQ, k, n), recipe, bf16, low, bw).pays
    return pays


def _profile(tmp_path, *args, spawn=False):
    """``main.py profile``: by the real process where ``spawn``, else in this process (the
    refusals' lines and the trial's figures are the subject)."""
    if spawn:
        return subprocess.run([sys.executable, "main.py", "profile", *args], cwd=ROOT,
                              capture_output=True, text=True, check=False, env=_env(tmp_path))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AMPSCOPE_DATA_DIR", str(tmp_path / "data"))
        env.setenv("AMPSCOPE_CACHE_DIR", str(tmp_path / "cache"))
        return run_cli("profile", *args)


@pytest.mark.parametrize("family", ["llama-gqa", "gpt2"])
def test_auto_converts_the_layers_that_pay_on_the_named_card(family, tmp_path):
    folder = _folder(family, tmp_path)
    pays = _expected(folder, "fp8")
    assert any(pays.values()) and not all(pays.values())  # a mixed table, or nothing is tested
    if family == "llama-gqa":  # as torchao's table has it: MLPs pay, grouped k/v do not
        assert all(p for n, p in pays.items() if ".mlp." in n)
        assert not any(p for n, p in pays.items() if n.endswith(("k_proj", "v_proj")))
    out = tmp_path / "r.json"
    # one family by the real process end to end, the other in this process
    run = _profile(tmp_path, "--model", str(folder), "--precision", "fp8:auto", "--card", "H20",
                   "--batch-size", str(BATCH), "--seq-len", str(SEQ), "--steps", "1",
                   "--warmup", "0", "--device", "cpu", "--isolation", "inline", "--data",
                   "random", "--no-kernel-profile", "--no-quant-error", "--out", str(out),
                   spawn=family == "gpt2")
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(out.read_text())
    (trial,) = report["trials"]
    assert trial["status"] == "ok", trial["reason"]
    auto = trial["fp8_auto"]
    assert auto["card"] == CARD and "this trial ran on the CPU" in auto["card_source"]
    assert auto["tokens"] == BATCH * SEQ
    assert set(auto["converted"]) == {n for n, p in pays.items() if p}
    assert set(auto["kept_bf16"]) == {n for n, p in pays.items() if not p}
    (note,) = [n for n in trial["notes"] if n.startswith("fp8:auto: the payoff of")]
    assert "predicted, not measured" in note
    assert all(name in note for name in pays)  # converted and kept, each named
    assert " ".join(note.split()) in " ".join(run.stdout.split())  # the CLI prints it
    # the report's payoff table is the card's the trial weighed (on the CPU: --card's)
    assert set(report["payoff"][CARD]["fp8"]["keep_bf16"]) == set(auto["kept_bf16"])
    assert report["payoff"][CARD]["fp8"]["verdict"].startswith(
        f"fp8 would pay for {sum(pays.values())} of {len(pays)} layers of {folder} at "
        f"{BATCH} x {SEQ} on {CARD}")
    scaling = next(n for n in trial["notes"] if n.startswith("float8 scaling"))
    assert f"of {sum(pays.values())} Linear layers" in scaling


def test_auto_on_the_cpu_needs_a_card_with_fp8(tmp_path):
    run = _profile(tmp_path, "--model", "tiny", "--precision", "fp8-rowwise:auto",
                   "--device", "cpu")
    assert run.returncode == 2
    (line,) = run.stderr.strip().splitlines()
    assert "runs on the CPU" in line and "--card" in line
    run = _profile(tmp_path, "--model", "tiny", "--precision", "fp8:auto", "--card", "T4",
                   "--device", "cpu")
    assert run.returncode == 2
    (line,) = run.stderr.strip().splitlines()
    assert "NVIDIA T4 (--card) has no payoff table for fp8" in line and "--card" in line
    run = _profile(tmp_path, "--model", "tiny", "--precision", "fp8-rowwise-gw-hp:auto",
                   "--device", "cpu")
    assert run.returncode == 2 and "':auto' follows one of fp8, fp8-rowwise" in run.stderr
    assert not (tmp_path / "data" / "runs").exists()  # nothing half-written


def test_plan_refuses_an_auto_recipe_and_says_what_to_plan(tmp_path):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AMPSCOPE_DATA_DIR", str(tmp_path / "data"))
        run = run_cli("plan", "--model", "tiny", "--precision", "bf16-amp,fp8-rowwise:auto",
                      "--card", "H100 SXM")
    assert run.returncode == 2
    (line,) = run.stderr.strip().splitlines()
    assert "fp8-rowwise:auto picks its layers per card: plan fp8-rowwise" in line
