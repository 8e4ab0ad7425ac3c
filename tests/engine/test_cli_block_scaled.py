"""The real ``python3 main.py profile`` process with the block-scaled recipes beside bf16:
every trial ends ok, the emulated ones say so and are not ranked, FLOPs come by dtype and
the loss against fp32; MXFP4 is refused before torch loads. NVFP4's own CLI runs are in
tests/engine/test_cli_nvfp4.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _cli(tmp_path, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AMPSCOPE_DATA_DIR": str(tmp_path / "data")}
    return subprocess.run([sys.executable, "main.py", *args], cwd=ROOT, capture_output=True,
                          text=True, env=env, timeout=600)


def lines_between(text: str, first: str, last: str | tuple[str, ...]) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    return lines[start:next(i for i, line in enumerate(lines) if line.startswith(last))]


def test_profile_runs_mxfp8_and_nvfp4_emulated(tmp_path):
    out = tmp_path / "r.json"
    run = _cli(tmp_path, "profile", "--model", "tiny", "--precision",
               "fp32,bf16-amp,mxfp8,nvfp4", "--device", "cpu", "--isolation", "inline",
               "--batch-size", "2", "--seq-len", "32", "--steps", "2", "--warmup", "0",
               "--no-kernel-profile", "--interleave", "off", "--out", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    trials = {t["precision"]: t for t in report["trials"]}
    assert trials["mxfp8"]["status"] == "ok"
    assert trials["mxfp8"]["support"] == "emulated"
    assert any(n.startswith("emulated:") for n in trials["mxfp8"]["notes"])
    assert (trials["nvfp4"]["status"], trials["nvfp4"]["support"]) == ("ok", "emulated")
    # FLOPs by the dtype that ran: the block projections in mxfp8, the tied head in bf16
    by_dtype = trials["mxfp8"]["flops"]["by_peak_dtype"]
    assert set(by_dtype) == {"mxfp8", "bf16"}
    assert sum(by_dtype.values()) == trials["mxfp8"]["flops"]["counted_per_step"]
    assert trials["mxfp8"]["memory"]["params_bytes"] == trials["fp32"]["memory"]["params_bytes"]
    rows = {r["precision"]: r for r in report["comparison"]["rows"]}
    assert rows["mxfp8"]["speed_verdict"] == "emulated: not representative"
    assert rows["nvfp4"]["speed_verdict"] == "emulated: not representative"
    base = trials["fp32"]["steps"][-1]["loss"]
    assert abs(rows["mxfp8"]["final_loss_diff_vs_fp32"]
               - (trials["mxfp8"]["steps"][-1]["loss"] - base)) < 1e-9
    table = lines_between(run.stdout, "Precision", ("MFU (model FLOPs)", "speed:"))
    assert max(len(line) for line in table) <= 120, "\n".join(table)
    (row,) = [line for line in table if line.startswith("mxfp8 ")]
    assert " emulated " in row
    assert any(line.startswith("  emulated: not representative: mxfp8, nvfp4 ")
               for line in table)
    # the FLOPs-by-dtype lines say the same mix as the report, and which trial was emulated
    said = {line.split()[0]: line for line in
            lines_between(run.stdout, "Hardware FLOPs per step", "Time in one")[1:]}
    total = sum(by_dtype.values())
    assert said["mxfp8"].startswith("  mxfp8 (emulated)")
    for dtype, flops in by_dtype.items():
        assert f"{dtype} {100 * flops / total:.1f}%" in said["mxfp8"]
    assert "bf16 100.0%" in said["bf16-amp"] and "fp32 100.0%" in said["fp32"]
    assert said["nvfp4"].startswith("  nvfp4 (emulated)") and "nvfp4 " in said["nvfp4"]


def test_mxfp4_is_refused_with_its_n_a_reason(tmp_path):
    run = _cli(tmp_path, "profile", "--precision", "bf16-amp,mxfp4")
    assert run.returncode == 2
    assert "mxfp4: n/a: torchao 0.18 has no MXFP4 training recipe" in run.stderr
    assert run.stdout == ""
