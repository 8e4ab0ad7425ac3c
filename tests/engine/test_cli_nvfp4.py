"""The real ``python3 main.py profile --precision fp32,nvfp4`` on the CPU, for a Llama-style
folder and the GPT-2 preset: nvfp4 is an ok, emulated trial with its loss, lost updates (n/a:
fp32 master weights), per-layer SQNR near 20 dB, its converted GEMMs' FLOPs under nvfp4
(6 x tokens x their weights, counted here from the config) and its speed left unranked."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import LlamaConfig

ROOT = Path(__file__).resolve().parents[2]
BATCH, SEQ = 2, 32


def _llama(tmp_path) -> tuple[str, int, int]:
    """A Llama config folder (bias-free Linears, grouped-query attention, untied head) and
    the weights of its converted Linears: q, k, v, o and the three MLP projections."""
    h, ff, heads, kv, layers = 64, 128, 4, 2, 2
    LlamaConfig(hidden_size=h, intermediate_size=ff, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv, vocab_size=256,
                max_position_embeddings=64).save_pretrained(tmp_path / "llama")
    kv_width = kv * h // heads
    return str(tmp_path / "llama"), 7 * layers, layers * (2 * h * h + 2 * h * kv_width
                                                          + 3 * h * ff)


def _gpt2(tmp_path) -> tuple[str, int, int]:
    """The "tiny" preset (GPT-2, width 128, 2 layers): c_attn, attention c_proj, c_fc, MLP
    c_proj; its tied lm_head stays in bf16."""
    preset = json.loads((ROOT / "resources" / "presets.json").read_text())["presets"][0]
    assert preset["name"] == "tiny" and preset["config"]["model_type"] == "gpt2"
    h, layers = preset["config"]["n_embd"], preset["config"]["n_layer"]
    return "tiny", 4 * layers, layers * (h * 3 * h + h * h + 2 * h * 4 * h)


@pytest.mark.parametrize("family", [_llama, _gpt2])
def test_profile_runs_nvfp4_emulated_with_its_numerics(tmp_path, family):
    model, converted_layers, converted_weights = family(tmp_path)
    out = tmp_path / "r.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AMPSCOPE_DATA_DIR": str(tmp_path / "data")}
    run = subprocess.run(
        [sys.executable, "main.py", "profile", "--model", model, "--precision", "fp32,nvfp4",
         "--device", "cpu", "--isolation", "inline", "--batch-size", str(BATCH), "--seq-len",
         str(SEQ), "--steps", "2", "--warmup", "0", "--no-kernel-profile", "--interleave",
         "off", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, env=env,
        timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    trials = {t["precision"]: t for t in report["trials"]}
    nv = trials["nvfp4"]
    assert (nv["status"], nv["support"]) == ("ok", "emulated")
    assert nv["support_reason"].startswith("the CPU has no FP4 matrix unit")
    assert "speed is not representative (emulated GEMMs run in higher precision)" in \
        nv["support_reason"]
    (note,) = [n for n in nv["notes"] if "EmulatedNVFP4Linear" in n]
    assert "Transformer Engine" in note and f"NVFP4 training of {converted_layers} " in note
    # what the emulation keeps for backward (fp32) beside a card's 4.5 bits per element
    assert f"hold {converted_weights * 4 / 2**20:.2f} MiB (fp32)" in note
    assert f"would hold {converted_weights * 9 / 16 / 2**20:.2f} MiB (4-bit" in note
    losses = [s["loss"] for s in nv["steps"]]
    assert len(losses) == 3 and all(isinstance(v, float) for v in losses)
    # the emulation keeps fp32 master weights, as the native recipe does: no update is lost
    assert nv["lost_updates"] is None
    assert "fp32 master copy" in nv["lost_updates_reason"]
    # every converted layer's SQNR: weights in 16x16 blocks a little under 1x16's ~20.4 dB
    rows = nv["quant_error"]["layers"]
    layers = [r for r in rows if r["format"].startswith("nvfp4") and "emulated" in r["format"]]
    assert [r["name"] for r in rows if r not in layers] == ["lm_head"]  # bf16 under autocast
    assert len(layers) == converted_layers
    assert all(17.5 < r["weight_db"] < 20.5 for r in layers), [r["weight_db"] for r in layers]
    assert all(12 < r["input_db"] < 22 for r in layers), [r["input_db"] for r in layers]
    # FLOPs: forward, input- and weight-gradient GEMMs of the converted layers under nvfp4
    tokens = BATCH * SEQ
    assert nv["flops"]["by_peak_dtype"]["nvfp4"] == 6 * tokens * converted_weights
    assert nv["flops"]["by_op"]["ampscope.emulated_mm"] == 6 * tokens * converted_weights
    assert sum(nv["flops"]["by_peak_dtype"].values()) == nv["flops"]["counted_per_step"]
    # memory: what the emulation held, its fp32 master weights as large as fp32's
    assert nv["memory"]["params_bytes"] == trials["fp32"]["memory"]["params_bytes"]
    assert nv["memory"]["total_bytes"] > 0
    compared = {r["precision"]: r for r in report["comparison"]["rows"]}
    assert compared["nvfp4"]["speed_verdict"] == "emulated: not representative"
    assert compared["nvfp4"]["final_loss_diff_vs_fp32"] == pytest.approx(
        losses[-1] - trials["fp32"]["steps"][-1]["loss"], abs=1e-9)
    figures = {f["precision"]: f for f in report["comparison"]["verdict"]["figures"]}
    # judged on memory and loss only: the emulation's fp32 copies hold more than fp32's step
    assert figures["nvfp4"]["judgement"] == "not better"
    assert figures["nvfp4"]["note"] == "not 5% smaller (emulated: speed not judged)"
    said = [line for line in run.stdout.splitlines() if line.startswith("  nvfp4 (emulated)")]
    assert said and "nvfp4 " in said[0]
