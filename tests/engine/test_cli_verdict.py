"""The CLI's profile output opens with the verdict, before the comparison table."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _median_ms(trial: dict) -> float:
    return statistics.median(s["step_ms"] for s in trial["steps"]
                             if not s["warmup"] and not s["skipped"])


def _busy(trial: dict) -> bool:
    """The stated rule, recomputed: load above the core count or others above 25%."""
    load = trial.get("host_load") or {}
    return ((load.get("load_avg_1m_mean") or 0) > load.get("cpu_count", 1 << 30)
            or (load.get("other_cpu_pct_mean") or 0) > 25)


def test_profile_prints_the_verdict_before_the_table(tmp_path):
    out = tmp_path / "run.json"
    run = subprocess.run(
        [sys.executable, "main.py", "profile", "--model", "tiny", "--precision",
         "fp32,bf16-amp", "--batch-size", "1", "--seq-len", "16", "--steps", "6",
         "--warmup", "1", "--device", "cpu", "--interleave", "off", "--no-kernel-profile",
         "--isolation", "inline", "--quiet", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("Precision"))
    verdicts = [i for i, line in enumerate(lines) if line.startswith("verdict: ")]
    assert verdicts == [0] and header > 0, run.stdout
    line = lines[0]
    assert line.startswith(("verdict: Train in fp32", "verdict: Train in bf16-amp",
                            "verdict: No recommendation: "))
    trials = {t["precision"]: t for t in json.loads(out.read_text())["trials"]}
    if any(_busy(t) for t in trials.values()):
        assert "the machine was busy" in line
        assert lines[1].startswith("  to do: close other programs")
        return
    # any speed-up the verdict cites is fp32's median step time over bf16-amp's
    cited = re.findall(r"(\d+\.\d\d)x fp32's speed", line)
    expected = _median_ms(trials["fp32"]) / _median_ms(trials["bf16-amp"])
    assert all(c == f"{expected:.2f}" for c in cited), (cited, expected)


def test_help_and_presets_describe_every_precision():
    texts = json.loads((ROOT / "resources" / "precisions.json").read_text())
    assert list(texts) == ["fp32", "tf32", "fp16-amp", "bf16-amp", "fp16", "bf16", "int8",
                           "nf4", "fp8", "fp8-rowwise", "fp8-rowwise-gw-hp", "mxfp8", "nvfp4",
                           "fp8-fsdp-ag", "+adamw", "+sgd",
                           "+adamw8bit", "+adamw8bit-ao", "+adamw4bit", "+adamw-fp8",
                           "+adamw-bf16-sr", ":keep-ends", ":keep-attn", ":auto"]
    width = max(map(len, texts))
    for args in (["presets"], ["profile", "--help"], ["footprint", "--help"]):
        run = subprocess.run([sys.executable, "main.py", *args], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        lines = run.stdout.splitlines()
        for name, text in texts.items():
            assert f"  {name:<{width}} {text}" in lines, (args, name)
        assert max(len(line) for line in lines[-len(texts):]) <= 100
