"""plan against what an H200 measured (tests/data/h200_plan/h200_trials.json, an extract of
the reports of 2026-11-27): GPT-2 at 8 x 1024, every recipe traced here on the CPU. The
roofline is a lower bound (no predicted step above the measured one; tf32 at tf32's rate,
compiled steps with a fused step's traffic), and the traced peak equals the card's where
the trace follows the card (fp32, tf32, pure fp16 and bf16)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_in_process import run_cli
from tests.engine.test_h200_reports import unpack

ROOT = Path(__file__).resolve().parents[2]
DATA = json.loads((ROOT / "tests" / "data" / "h200_plan" / "h200_trials.json")
                  .read_text(encoding="utf-8"))
TABLE = json.loads((ROOT / "resources" / "peak_flops.json").read_text(encoding="utf-8"))
RECIPES = ("fp32", "tf32", "fp16-amp", "bf16-amp", "fp16", "bf16", "fp8")


def _measured(precision: str, compiled: bool = False) -> dict:
    """The H200's trial of GPT-2 at 8 x 1024 (``compiled``: run with --compile); fp8,
    compiled by default whatever the flag, its fastest run."""
    rows = [t for t in DATA["trials"] if t["precision"] == precision and t["model"] == "gpt2"
            and (t["batch_size"], t["seq_len"]) == (8, 1024)
            and (precision == "fp8" or t["compile"] == compiled)]
    return min(rows, key=lambda t: t["median_step_ms"])


@pytest.fixture(scope="module")
def planned():
    # in this process: the figures are the subject; the quantised plan below is spawned
    run = run_cli("plan", "--model", "gpt2", "--precision", ",".join(RECIPES), "--batch-size",
                  "8", "--seq-len", "1024", "--card", "H200", "--max-batch", "0",
                  "--no-history", "--no-levers", "--json", "--quiet")
    assert run.returncode == 0, run.stderr
    return {t["precision"]: t for t in json.loads(run.stdout)["trials"]}


def _h200() -> dict:
    return next(g for g in TABLE["gpus"] if re.search(g["match"], "NVIDIA H200"))


def _bound_ms(flops_by_dtype: dict, moved: int) -> float:
    """The roofline worked out here from the table: FLOPs at each dtype's peak, summed, or
    the bytes at the bandwidth, whichever is longer."""
    gpu = _h200()
    compute = sum(f / (gpu["peak_tflops"][k] * 1e12) for k, f in flops_by_dtype.items())
    return max(compute, moved / (gpu["memory_bandwidth_tbps"] * 1e12)) * 1e3


@pytest.mark.parametrize("precision", RECIPES)
def test_no_predicted_step_exceeds_the_h200s(planned, precision):
    trial = planned[precision]
    card = trial["cards"][0]
    assert card["card"] == "NVIDIA H200 SXM"
    measured = _measured(precision)["median_step_ms"]
    assert card["predicted_step_ms"] <= measured, (card["predicted_step_ms"], measured)
    compiled = precision == "fp8"  # float8 runs compiled on a card
    assert trial["compiled"] is compiled
    moved = trial["bytes_moved_fused"] if compiled else trial["bytes_moved"]
    # the blend divides the total by a FLOP-weighted harmonic peak: the same sum
    assert card["predicted_step_ms"] == pytest.approx(
        _bound_ms(trial["flops_by_peak_dtype"], moved), rel=1e-9)
    if precision == "tf32":  # fp32 matmuls at the tf32 tensor-core rate, not the CUDA cores'
        assert set(trial["flops_by_peak_dtype"]) == {"tf32"}


def test_a_compiled_bf16_amp_step_is_bounded_by_its_fused_traffic(planned):
    """The H200 ran bf16-amp compiled in 23.4 ms; the eager step's traffic alone would take
    longer than that, the fused step's does not."""
    trial = planned["bf16-amp"]
    measured = _measured("bf16-amp", compiled=True)["median_step_ms"]
    eager = _bound_ms(trial["flops_by_peak_dtype"], trial["bytes_moved"])
    fused = _bound_ms(trial["flops_by_peak_dtype"], trial["bytes_moved_fused"])
    assert fused <= measured < eager


@pytest.mark.parametrize("precision", ("fp32", "tf32", "fp16", "bf16"))
def test_traced_peak_equals_the_h200s(planned, precision):
    traced = planned[precision]["memory"]
    real = _measured(precision)["memory"]
    assert abs(traced["total_bytes"] - real["total_bytes"]) <= 0.02 * real["total_bytes"]
    for name in ("params_bytes", "grads_bytes", "optimizer_bytes"):
        # CUDA's allocator rounds each block to 512 B (AdamW's 148 one-element step
        # counts: 75,184 B more), which a trace of tensor sizes does not
        assert abs(traced[name] - real[name]) <= 0.001 * real[name], name


@pytest.mark.parametrize("precision", ("fp16-amp", "bf16-amp", "fp8"))
def test_autocast_traced_peak_within_2pct_of_the_h200s(planned, precision):
    traced = planned[precision]["memory"]["total_bytes"]
    real = _measured(precision)["memory"]["total_bytes"]
    assert abs(traced - real) <= 0.02 * real


def test_cli_compile_flag_uses_the_fused_traffic():
    """--compile on a tiny model: the memory bound is the fused count at the bandwidth."""
    run = run_cli("plan", "--model", "tiny", "--precision", "fp32", "--batch-size", "2",
                  "--seq-len", "32", "--card", "H200", "--max-batch", "0", "--no-history",
                  "--no-levers", "--compile", "--json", "--quiet")
    assert run.returncode == 0, run.stderr
    trial = json.loads(run.stdout)["trials"][0]
    card = trial["cards"][0]
    assert trial["compiled"] and 0 < trial["bytes_moved_fused"] < trial["bytes_moved"]
    assert card["memory_ms"] == pytest.approx(
        trial["bytes_moved_fused"] / (_h200()["memory_bandwidth_tbps"] * 1e12) * 1e3)
    assert "fused" in card["prediction_model"]


def test_cli_shows_measured_over_predicted_beside_a_trial_of_the_same_card(tmp_path):
    """The H200's own GPT-2 fp32 report at 2 x 128 named with --measured: the H200's line
    shows its median step over the roofline (at least 1: a lower bound), the RTX 4090's
    (another card) none; the traced peak equals the card's within 2%."""
    report = unpack("06-gpt2-fp32.json", tmp_path)  # the real report, gzipped in tests/data
    real = json.loads(report.read_text(encoding="utf-8"))["trials"][0]
    out = tmp_path / "plan.json"
    run = run_cli("plan", "--model", "gpt2", "--precision", "fp32", "--batch-size", "2",
                  "--seq-len", "128", "--card", "H200,RTX 4090", "--max-batch", "0",
                  "--no-history", "--no-levers", "--quiet", "--measured", str(report),
                  "--out", str(out))
    assert run.returncode == 0, run.stderr
    trial = json.loads(out.read_text(encoding="utf-8"))["trials"][0]
    h200, rtx = trial["cards"]
    ratio = real["summary"]["median_step_ms"] / h200["predicted_step_ms"]
    assert ratio >= 1
    lines = run.stdout.splitlines()
    h200_line = next(x for x in lines if x.startswith("  NVIDIA H200 SXM:"))
    assert h200_line.endswith(f"; measured / predicted {ratio:.2f}")
    assert "measured / predicted" not in next(x for x in lines
                                              if x.startswith("  NVIDIA GeForce RTX 4090:"))
    assert trial["measured"]["step_ms"] == real["summary"]["median_step_ms"]
    measured = real["memory"]["total_bytes"]
    assert abs(trial["memory"]["total_bytes"] - measured) <= 0.02 * measured


QUANTISED = ("int8", "nf4")


@pytest.fixture(scope="module")
def quantised(tmp_path_factory):
    """plan of GPT-2 int8 and nf4 at 4 x 256 beside the H200's own report of that run, by
    the real process (bitsandbytes keeps the CPU's own features there: see conftest)."""
    folder = tmp_path_factory.mktemp("h200")
    report = unpack("03-gpt2-int8_nf4.json", folder)  # the real report, gzipped in tests/data
    out = folder / "plan.json"
    run = subprocess.run([sys.executable, "main.py", "plan", "--model", "gpt2", "--precision",
                          ",".join(QUANTISED), "--batch-size", "4", "--seq-len", "256",
                          "--card", "H200", "--max-batch", "0", "--no-history", "--no-levers",
                          "--quiet", "--measured", str(report), "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stderr
    real = {t["precision"]: t for t in json.loads(report.read_text(encoding="utf-8"))["trials"]}
    planned = {t["precision"]: t for t in json.loads(out.read_text(encoding="utf-8"))["trials"]}
    return run.stdout, planned, real


@pytest.mark.parametrize("precision", QUANTISED)
def test_quantised_traced_peak_and_categories_within_2pct_of_the_h200s(quantised, precision):
    """bitsandbytes' layers traced as on CUDA: every category the H200 measured (its
    quantisation state rounded to 512-B blocks: nf4's 48 code books of 64 B, 21 KiB in
    all, within 0.5%), the peak's phase and the H200's counted FLOPs by dtype."""
    stdout, planned, real = quantised
    trial, measured = planned[precision], real[precision]
    assert trial["method"] == "traced", trial["reason"]
    traced = trial["memory"]
    for name in ("total_bytes", "params_bytes", "buffers_bytes", "quant_state_bytes",
                 "grads_bytes", "optimizer_bytes", "inputs_bytes", "weight_copies_bytes",
                 "activations_bytes", "temporaries_bytes"):
        value = measured["memory"][name]
        assert abs(traced[name] - value) <= 0.02 * value, (name, traced[name], value)
    assert traced["quant_state_bytes"] > 0 and traced["weight_copies_bytes"] > 0
    assert traced["peak_phase"] == measured["memory"]["peak_phase"]
    assert trial["flops_by_peak_dtype"] == measured["flops"]["by_peak_dtype"]
    head = next(x for x in stdout.splitlines() if x.startswith(f"{precision}: peak "))
    for name in ("params", "weight copies", "activations", "temporaries", "quant state"):
        assert name in head, name
    assert "(traced)" in head


@pytest.mark.parametrize("precision", QUANTISED)
def test_quantised_roofline_is_at_or_below_the_h200s_step(quantised, precision):
    """The roofline of the kernels that run (int8 matmuls, the dequantised weights in
    backward) at the table's peaks, printed as measured / predicted beside the H200's."""
    stdout, planned, real = quantised
    trial = planned[precision]
    card = trial["cards"][0]
    measured = real[precision]["summary"]["median_step_ms"]
    assert card["predicted_step_ms"] <= measured, (card["predicted_step_ms"], measured)
    assert card["predicted_step_ms"] == pytest.approx(
        _bound_ms(trial["flops_by_peak_dtype"], trial["bytes_moved"]), rel=1e-9)
    lines = stdout.splitlines()
    start = lines.index(next(x for x in lines if x.startswith(f"{precision}: peak ")))
    h200 = next(x for x in lines[start:] if x.startswith("  NVIDIA H200 SXM:"))
    assert h200.endswith(f"; measured / predicted {measured / card['predicted_step_ms']:.2f}")
