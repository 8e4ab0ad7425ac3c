"""Lost updates, held-out loss and the verdict through the real ``python3 main.py`` process:
a CPU run of the tiny preset at fp32, bf16, fp16 and bf16+adamw-bf16-sr, and the real H200
report (tests/data/README.md, h200-2026-11-27), whose pure bf16/fp16 trials were never
measured."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_in_process import run_cli

ROOT = Path(__file__).resolve().parents[2]
H200 = (ROOT / "tests/data/h200-2026-11-27/reports/"
        "01-gpt2-fp32_tf32_fp16-amp_bf16-amp_fp16_bf16.json.gz")
EMBEDDINGS, NORMS = ("wte", "wpe"), ("ln_",)


def group_of(name: str, shape: list[int]) -> str:
    if any(k in name for k in EMBEDDINGS):
        return "embeddings"
    if any(k in name for k in NORMS):
        return "norms"
    return "matmul weights" if name.endswith("weight") and len(shape) == 2 else "other"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The run and its HTML report, made in this process (spawned ``profile``:
    test_cli_spread; spawned ``report``: the H200 test below)."""
    out = tmp_path_factory.mktemp("lost") / "run.json"
    proc = run_cli(
        "profile", "--model", "tiny", "--precision", "fp32,bf16,fp16,bf16+adamw-bf16-sr",
        "--batch-size", "1", "--seq-len", "16", "--steps", "2", "--warmup", "1",
        "--device", "cpu", "--interleave", "off", "--no-kernel-profile", "--isolation",
        "inline", "--quiet", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    html = out.with_suffix(".html")
    written = run_cli("report", str(out), "--out", str(html))
    assert written.returncode == 0, written.stderr
    return proc.stdout, json.loads(out.read_text()), html.read_text()


def test_each_low_precision_trial_reports_its_lost_updates(run):
    stdout, report, html = run
    trials = {t["precision"]: t for t in report["trials"]}
    assert trials["fp32"]["lost_updates"] is None
    assert trials["fp32"]["lost_updates_reason"].startswith(
        "n/a: the trained weights are stored in fp32")
    for p in ("bf16", "fp16", "bf16+adamw-bf16-sr"):
        t = trials[p]
        assert t["status"] == "ok", t["reason"]
        lu = t["lost_updates"]
        assert lu["weight_dtype"] == ("float16" if p == "fp16" else "bfloat16")
        assert lu["rounding"] == ("stochastic" if "sr" in p else "nearest")
        # every trainable element is filed in one group, at each rate: the groups recounted
        # here from the parameters' names and shapes in the report's dtype map
        mine: dict[str, int] = {}
        for param in t["dtype_map"]:
            if param["trainable"] and not param["tied_to"]:
                g = group_of(param["name"], param["shape"])
                mine[g] = mine.get(g, 0) + param["numel"]
        for lr in (lu["lr"], lu["min_lr"]):
            theirs = {g["group"]: g["updated_elements"] for g in lu["groups"] if g["lr"] == lr}
            assert theirs.keys() == mine.keys()
            # random non-zero weights always move (weight decay at least); a zero bias whose
            # gradient flushed to zero in fp16 (and Adam's state with it) has no update at all
            assert all(theirs[g] == mine[g] for g in ("embeddings", "matmul weights"))
            assert all(0.9 * mine[g] <= theirs[g] <= mine[g] for g in mine), (theirs, mine)
        for key in ("element_share", "norm_share", "min_lr_element_share",
                    "min_lr_norm_share"):
            assert 0.0 <= lu[key] <= 1.0
    # round-to-nearest bf16 loses most of an update at lr 1e-5 on weights this size;
    # stochastic rounding keeps it on average
    assert trials["bf16"]["lost_updates"]["min_lr_norm_share"] > 0.5
    assert abs(trials["bf16+adamw-bf16-sr"]["lost_updates"]["min_lr_kept_share"] - 1) < 0.1
    # the held-out loss: before and after, over the same batches for every precision
    held = {p: t["heldout_loss"] for p, t in trials.items()}
    assert len({(h["tokens"], round(h["loss_before"], 2)) for h in held.values()}) == 1
    assert all(h["steps"] == 1 + 2 + 1 for h in held.values())  # warm-up, steps, memory step
    # shown: the terminal's table and the verdict, the HTML table and its explanation
    verdict = stdout.splitlines()[0]
    assert "bf16 would lose" in verdict and "train in bf16-amp" in verdict, verdict
    assert "fp16 would lose" in verdict or "fp16 (" not in verdict
    assert "Lost updates: share of one optimiser step" in stdout
    assert "why: a weight stored in bf16" in stdout
    assert 'id="lost-updates"' in html and "Why updates get lost: master weights" in html


def test_h200_report_recommends_an_amp_recipe_and_says_why_not_pure_weights(tmp_path):
    report = tmp_path / H200.name.removesuffix(".gz")  # the real file, as it was written
    report.write_bytes(gzip.decompress(H200.read_bytes()))
    out = tmp_path / "h200.html"
    proc = subprocess.run([sys.executable, "main.py", "report", str(report), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    page = out.read_text()
    start = page.index("Train in ")
    headline = page[start:page.index("<", start)]
    assert headline.startswith(("Train in bf16-amp:", "Train in fp16-amp:")), headline
    assert "Not recommended: fp16 (pure fp16 weights, no fp32 master copy" in headline
    assert "bf16 (pure bf16 weights, no fp32 master copy" in headline
    assert "was not measured: profile again to measure it" in headline
    # the changed optimizer and the loss rule are among the reasons
    assert "fp16 ran a changed optimizer: Adam&#x27;s epsilon raised from 1e-8 to 6.1e-05" \
        in page
    assert "fp32&#x27;s loss fell 0.212 in 10 steps" in page
