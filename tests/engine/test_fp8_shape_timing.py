"""``main.py peak --fp8-shapes`` times each distinct Linear shape of a model in bf16 and
float8 on this device (here the CPU, for real: torchao's float8 runs emulated) and caches
it; a plan's payoff table shows a card's measured figures beside its predictions only where
that card timed that shape, and never another device's figures."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import AutoConfig, AutoModel
from transformers.pytorch_utils import Conv1D

from tests.cli_in_process import run_cli
from tests.engine.families import FAMILIES

ROOT = Path(__file__).resolve().parents[2]
BATCH, SEQ = 2, 8
H100 = "NVIDIA H100 80GB HBM3"  # what torch.cuda.get_device_name says on an H100 SXM


def _cli(cache: Path, *args, spawn=False) -> subprocess.CompletedProcess:
    """The command with ``cache`` as the cache folder: in this process (its figures and
    lines are the subject), or by the real process end to end where ``spawn``."""
    if spawn:
        env = {**os.environ, "AMPSCOPE_CACHE_DIR": str(cache)}
        return subprocess.run([sys.executable, "main.py", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=3600)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AMPSCOPE_CACHE_DIR", str(cache))
        return run_cli(*args)


def _shapes(folder: Path) -> dict[tuple[int, int, int], int]:
    """(M, K, N) -> how many layers have it: every Linear (GPT-2's Conv1D too) but the LM
    head with both dims divisible by 16, counted from transformers' own modules."""
    with torch.device("meta"):
        model = AutoModel.from_config(AutoConfig.from_pretrained(folder))
    out: dict = {}
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            k, n = mod.in_features, mod.out_features
        elif isinstance(mod, Conv1D):
            k, n = mod.weight.shape
        else:
            continue
        if k % 16 == 0 and n % 16 == 0 and "lm_head" not in name:
            out[(BATCH * SEQ, int(k), int(n))] = out.get((BATCH * SEQ, int(k), int(n)), 0) + 1
    return out


@pytest.mark.parametrize("family", ["gpt2", "llama-gqa"])
def test_each_distinct_shape_is_timed_once_cached_and_only_its_card_shows_it(tmp_path, family):
    folder = tmp_path / family
    FAMILIES[family]().save_pretrained(folder)
    cache = tmp_path / "cache"
    run = _cli(cache, "peak", "--fp8-shapes", "--model", str(folder), "--batch-size",
               str(BATCH), "--seq-len", str(SEQ), "--device", "cpu", "--json")
    assert run.returncode == 0, run.stderr
    shown = json.loads(run.stdout)
    entries = json.loads((cache / "fp8_shape_timing.json").read_text(encoding="utf-8"))
    (key, entry), = entries.items()
    assert entry["kind"] == "cpu" and key == shown["key"] and key.startswith(entry["device"])
    expected = _shapes(folder)
    assert len(expected) >= 2
    assert {(s["m"], s["k"], s["n"]) for s in entry["shapes"].values()} == set(expected)
    assert [(s["m"], s["k"], s["n"]) for s in shown["shapes"]] == sorted(
        expected, key=lambda s: (s[0] * s[1] * s[2], s[1], s[2]))  # each once
    assert {(s["m"], s["k"], s["n"]): s["layers"] for s in shown["shapes"]} == expected
    labels = [r for r in ("fp8", "fp8-rowwise") if r not in entry["reasons"]]
    assert "fp8" in labels  # tensorwise runs on any torch's CPU
    for shape in shown["shapes"]:
        cached = entry["shapes"][f"{shape['m']}x{shape['k']}x{shape['n']}"]
        for timing in ("bf16", *labels):
            t = cached[timing]
            assert 0 < t["min_ms"] <= t["median_ms"] <= t["max_ms"] and t["reps"] >= 3
        for label in labels:
            ratio = cached["bf16"]["median_ms"] / cached[label]["median_ms"]
            assert shape[f"{label}_speedup"] == pytest.approx(ratio, rel=1e-12)

    # the CPU's timings beside a card's faked ones: only the H100's rows say measured
    fake = {f"{m}x{k}x{n}": {"m": m, "k": k, "n": n, "bf16": {"median_ms": 1 + k / 100},
                             "fp8": {"median_ms": 1.0}, "fp8-rowwise": {"median_ms": 2.0}}
            for m, k, n in expected}
    entries[f"{H100} | torch {torch.__version__}"] = {
        "device": H100, "kind": "cuda", "torch_version": torch.__version__,
        "measured_at_s": 1.0, "shapes": fake}
    # an H200's damaged entry (no bf16 median, a zero one) gives no figure, and no error
    entries["NVIDIA H200 | damaged"] = {
        "device": "NVIDIA H200", "kind": "cuda", "shapes": {
            name: {"bf16": {}, "fp8": {"median_ms": 0}, "fp8-rowwise": "?"} for name in fake}}
    entries["not an entry"] = 3
    (cache / "fp8_shape_timing.json").write_text(json.dumps(entries), encoding="utf-8")
    run = _cli(cache, "plan", "--model", str(folder), "--precision", "bf16-amp",
               "--batch-size", str(BATCH), "--seq-len", str(SEQ), "--card", "H100 SXM,H200",
               "--max-batch", "0", "--no-history", "--no-levers", "--quiet", "--json")
    assert run.returncode == 0, run.stderr
    payoff = json.loads(run.stdout)["payoff"]
    assert set(payoff) == {"NVIDIA H100 SXM5", "NVIDIA H200 SXM"}
    for label in ("fp8", "fp8-rowwise"):
        h100 = payoff["NVIDIA H100 SXM5"][label]["layers"]
        assert sum(expected.values()) == len(h100)
        for row in h100:
            figures = fake[f"{row['m']}x{row['k']}x{row['n']}"]
            assert row["measured_speedup"] == pytest.approx(
                figures["bf16"]["median_ms"] / figures[label]["median_ms"], rel=1e-12)
            assert row["measured_on"] == H100
            assert row["speedup"] != row["measured_speedup"]  # the prediction is kept
        for row in payoff["NVIDIA H200 SXM"][label]["layers"]:  # nor the CPU's figures
            assert row["measured_speedup"] is None and row["measured_on"] is None
    text = _cli(cache, "plan", "--model", str(folder), "--precision", "bf16-amp",
                "--batch-size", str(BATCH), "--seq-len", str(SEQ), "--card", "H200",
                "--max-batch", "0", "--no-history", "--no-levers", "--quiet").stdout
    rows = [ln for ln in text.splitlines() if ln.lstrip().startswith(("pays ", "does not pay"))]
    assert rows and all(ln.endswith("predicted (no timing of this shape on this card is "
                                    "cached)") for ln in rows)


def test_the_cache_is_read_again_and_bad_input_says_what_to_do(tmp_path):
    folder = tmp_path / "gpt2"
    FAMILIES["gpt2"]().save_pretrained(folder)
    cache = tmp_path / "cache"
    for args, words in ((("--model", str(folder)), "add --fp8-shapes"),
                        (("--fp8-shapes",), "needs --model"),
                        (("--fp8-shapes", "--model", str(folder), "--batch-size", "0"),
                         "at least 1")):
        run = _cli(cache, "peak", *args)
        assert run.returncode == 2 and words in run.stderr
        assert len(run.stderr.strip().splitlines()) == 1
        assert not cache.exists()  # nothing half-written
    args = ("peak", "--fp8-shapes", "--model", str(folder), "--batch-size", "1",
            "--seq-len", "16", "--device", "cpu")
    first = _cli(cache, *args, spawn=True)  # the file's one real process
    assert first.returncode == 0, first.stderr
    written = (cache / "fp8_shape_timing.json").read_text(encoding="utf-8")
    second = _cli(cache, *args)
    assert second.returncode == 0 and "no card's payoff row uses them" in second.stdout
    assert (cache / "fp8_shape_timing.json").read_text(encoding="utf-8") == written


def test_timing_a_shape_leaves_torchs_random_state_as_it_found_it():
    from engine.measure.fp8_shape_timing import time_shape

    before = torch.get_rng_state()
    timed = time_shape(BATCH * SEQ, 32, 48, ["fp8"], torch.device("cpu"), 3)
    assert set(timed) == {"bf16", "fp8"}
    assert torch.equal(before, torch.get_rng_state())


@pytest.mark.gpu
def test_on_a_gpu_its_own_card_shows_the_timings(tmp_path):
    """On a GPU the CLI times with CUDA events under the name torch gives the card, and a
    plan naming that card shows exactly those ratios as measured."""
    folder = tmp_path / "llama"
    FAMILIES["llama-gqa"]().save_pretrained(folder)
    cache = tmp_path / "cache"
    run = _cli(cache, "peak", "--fp8-shapes", "--model", str(folder), "--batch-size",
               str(BATCH), "--seq-len", str(SEQ), "--device", "cuda", "--json")
    assert run.returncode == 0, run.stderr
    shown = json.loads(run.stdout)
    assert shown["kind"] == "cuda" and shown["device"] == torch.cuda.get_device_name()
    assert shown["timer"] == "CUDA events"
    if shown["reasons"]:  # a GPU without float8 GEMMs says why, and times no recipe
        assert set(shown["reasons"]) == {"fp8", "fp8-rowwise"}
        return
    run = _cli(cache, "plan", "--model", str(folder), "--precision", "bf16-amp",
               "--batch-size", str(BATCH), "--seq-len", str(SEQ), "--card", shown["device"],
               "--max-batch", "0", "--no-history", "--no-levers", "--quiet", "--json")
    assert run.returncode == 0, run.stderr
    ratios = {(s["m"], s["k"], s["n"]): s for s in shown["shapes"]}
    (recipes,) = json.loads(run.stdout)["payoff"].values()
    if "reason" in recipes:  # a card the peaks table does not know: no payoff to show
        pytest.skip(f"{shown['device']}: {recipes['reason']}")
    for label, entry in recipes.items():
        assert entry["layers"]
        for row in entry["layers"]:
            if label not in ("fp8", "fp8-rowwise"):  # MXFP8 / NVFP4 are not timed
                assert row["measured_speedup"] is None and row["measured_on"] is None
                continue
            assert row["measured_on"] == shown["device"]
            assert row["measured_speedup"] == pytest.approx(
                ratios[(row["m"], row["k"], row["n"])][f"{label}_speedup"], rel=1e-12)


def test_a_shape_too_large_for_the_cpus_budget_is_skipped_and_said_so(tmp_path):
    from engine.measure.fp8_shape_timing import CPU_MAX_FLOPS

    folder = tmp_path / "gpt2"
    FAMILIES["gpt2"]().save_pretrained(folder)
    cache = tmp_path / "cache"
    batch, seq = 32, 128
    shapes = {(batch * seq, k, n) for _, k, n in _shapes(folder)}
    large = {s for s in shapes if 6 * s[0] * s[1] * s[2] > CPU_MAX_FLOPS}
    assert large and large != shapes  # this size times some shapes and skips others
    run = _cli(cache, "peak", "--fp8-shapes", "--model", str(folder), "--batch-size",
               str(batch), "--seq-len", str(seq), "--device", "cpu", "--json")
    assert run.returncode == 0, run.stderr
    shown = json.loads(run.stdout)
    assert {tuple(map(int, s.split("x"))) for s in shown["skipped"]} == large
    assert all("not timed" in why and "GFLOP" in why for why in shown["skipped"].values())
    assert {(s["m"], s["k"], s["n"]) for s in shown["shapes"]} == shapes - large
