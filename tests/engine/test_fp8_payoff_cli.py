"""``main.py plan`` says, layer by layer, whether fp8 would pay (issue #49's Done-when):
GPT-2 small at 8 x 1024 on an H200 gains nothing; Llama 3 8B on an H100 SXM: the MLP
projections pay at 4 x 2048, the grouped k/v projections do not, and at 1 x 2048 the step
gains under 5%. Shapes are checked against each model's config; the step's speed-up is
recomputed here from the layers and the plan's own 16-bit step."""

import gzip
import html
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine.models.presets import get_preset
from tests.cli_in_process import run_cli

ROOT = Path(__file__).resolve().parents[2]


def plan(model, batch, card, *extra, spawn=False):
    """``main.py plan``'s stdout: in this process (the figures are the subject), or, where
    ``spawn``, by the real process end to end."""
    args = ("plan", "--model", model, "--precision", "bf16-amp", "--batch-size", str(batch),
            "--seq-len", "2048" if model != "gpt2" else "1024", "--card", card, "--max-batch",
            "0", "--no-history", "--no-levers", "--quiet", *extra)
    run = (subprocess.run([sys.executable, "main.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=3600) if spawn else run_cli(*args))
    assert run.returncode == 0, run.stderr
    return run.stdout


def check_step(data, card, recipe):
    """The step's speed-up from the layers and the plan's bf16-amp step on the card."""
    entry = data["payoff"][card][recipe]
    step = next(c["predicted_step_ms"] for c in data["trials"][0]["cards"]
                if c["card"] == card)
    basis = max(step, sum(r["bf16_us"] for r in entry["layers"]) / 1e3)
    saved = sum(r["bf16_us"] - r["low_us"] for r in entry["layers"]) / 1e3
    assert entry["step_speedup"] == pytest.approx(basis / (basis - saved), rel=1e-3)
    assert "bf16-amp step" in entry["step_basis"]
    return entry["step_speedup"]


@pytest.fixture(scope="module")
def llama_4x2048():
    return json.loads(plan("llama-3-8b", 4, "H100 SXM", "--json"))


def test_gpt2_small_on_an_h200_gains_nothing_and_the_table_says_why(tmp_path):
    page = tmp_path / "plan.html"
    text = plan("gpt2", 8, "H200", "--out", str(page), spawn=True)
    assert "fp8 payoff" in text
    lines = [ln for ln in text.splitlines() if "transformer.h.*." in ln]
    assert lines and all("8192 x " in ln for ln in lines)  # M = 8 x 1024 tokens
    assert any("does not pay" in ln and "below break-even" in ln for ln in lines)
    data = json.loads(plan("gpt2", 8, "H200", "--json"))
    entry = data["payoff"]["NVIDIA H200 SXM"]
    assert set(entry) == {"fp8", "fp8-rowwise"}  # Hopper: no block-scaled GEMMs
    for recipe in entry:
        assert check_step(data, "NVIDIA H200 SXM", recipe) < 1.0  # no step gain
    # the verdict names the largest GEMM (the MLP's, n_embd x 4 n_embd) and where it pays
    config = get_preset("gpt2").build_config()
    rowwise = entry["fp8-rowwise"]["verdict"]
    assert rowwise.startswith("fp8-rowwise would not pay for gpt2 at 8 x 1024 on NVIDIA H200")
    assert f"largest GEMM (8192 x {config.n_embd} x {4 * config.n_embd})" in rowwise
    assert rowwise in text and html.escape(rowwise) in page.read_text(encoding="utf-8")
    tokens = int(re.search(r"it would from (\d+) tokens", rowwise).group(1))
    assert tokens > 8192 and tokens % 8192 == 0
    # the filter printed for each recipe where some layers pay keeps exactly the others
    filters = [ln.split("module_filter_fn=", 1)[1] for ln in text.splitlines()
               if "filter to paste" in ln]
    paying = [e for e in entry.values() if any(r["pays"] for r in e["layers"])]
    assert len(filters) == len(paying)
    for line, e in zip(filters, paying):
        keep = eval(line)  # noqa: S307 (the CLI's own output, as a user pastes it)
        assert [r["name"] for r in e["layers"] if not keep(None, r["name"])] == e["keep_bf16"]
    assert len(entry["fp8"]["layers"]) == 4 * config.n_layer  # lm_head stays in bf16
    assert {(r["k"], r["n"]) for r in entry["fp8"]["layers"]} == {
        (config.n_embd, 3 * config.n_embd), (config.n_embd, config.n_embd),
        (config.n_embd, 4 * config.n_embd), (4 * config.n_embd, config.n_embd)}


def test_llama3_8b_mlp_pays_and_grouped_kv_does_not(llama_4x2048):
    config = get_preset("llama-3-8b").build_config()
    kv = config.num_key_value_heads * config.hidden_size // config.num_attention_heads
    for recipe in ("fp8", "fp8-rowwise"):
        entry = llama_4x2048["payoff"]["NVIDIA H100 SXM5"][recipe]
        by_leaf = {}
        for r in entry["layers"]:
            assert r["m"] == 4 * 2048
            by_leaf.setdefault(r["name"].rsplit(".", 1)[-1], []).append(r)
        for leaf in ("gate_proj", "up_proj", "down_proj"):
            rows = by_leaf[leaf]
            assert len(rows) == config.num_hidden_layers and all(r["pays"] for r in rows)
            assert {(r["k"], r["n"]) for r in rows} <= {
                (config.hidden_size, config.intermediate_size),
                (config.intermediate_size, config.hidden_size)}
        for leaf in ("k_proj", "v_proj"):
            assert all((r["k"], r["n"]) == (config.hidden_size, kv) and not r["pays"]
                       for r in by_leaf[leaf])
            assert all(r["name"] in entry["keep_bf16"] for r in by_leaf[leaf])
        assert check_step(llama_4x2048, "NVIDIA H100 SXM5", recipe) > 0


def test_llama3_8b_at_one_sequence_gains_under_five_percent():
    data = json.loads(plan("llama-3-8b", 1, "H100 SXM", "--json"))
    for recipe in ("fp8", "fp8-rowwise"):
        assert check_step(data, "NVIDIA H100 SXM5", recipe) < 1.05


def test_the_h200_report_says_fp8_would_not_pay(tmp_path):
    """``main.py report`` re-exports the H200's compiled bf16-amp run of GPT-2 small: its
    payoff weighs each layer against the measured step (23.4 ms), and predicts no gain,
    as the H200's compiled fp8 run of the same shape measured (31.4 ms)."""
    source = tmp_path / "bf16-amp.json"
    source.write_bytes(gzip.decompress(
        (ROOT / "tests" / "data" / "h200-2026-11-27" / "reports" / "02-gpt2-bf16-amp.json.gz")
        .read_bytes()))
    out = tmp_path / "out.json"
    run = run_cli("report", str(source), "--out", str(out))
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text(encoding="utf-8"))
    measured = report["trials"][0]["summary"]["median_step_ms"]
    entry = report["payoff"]["NVIDIA H200"]
    for recipe, e in entry.items():
        saved = sum(r["bf16_us"] - r["low_us"] for r in e["layers"]) / 1e3
        assert e["step_speedup"] == pytest.approx(measured / (measured - saved), rel=1e-3)
        assert e["step_speedup"] < 1.0, recipe
        assert "measured median, compiled" in e["step_basis"]
        assert all(r["m"] == 8 * 1024 for r in e["layers"])
