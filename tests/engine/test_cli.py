import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.cli import main

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--model", "tiny", "--batch-size", "1", "--seq-len", "16", "--steps", "2",
        "--warmup", "0", "--device", "cpu", "--isolation", "inline", "--quiet"]


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("ampscope: error: ")
    return err[0]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--model", "no-such-model"], "not a preset"),
        (["--model", "./missing/folder"], "does not exist"),
        (["--precision", "fp12"], "unknown precision"),
        (["--batch-size", "0"], "--batch-size"),
        (["--steps", "-3"], "--steps"),
        (["--seq-len", "4096"], "--seq-len 512 or less"),
        (["--optimizer", "lion"], "invalid choice"),
    ],
)
def test_bad_profile_input_is_one_line_and_exit_2(args, fragment, tmp_path, capsys, hub_offline):
    out = tmp_path / "report.json"
    code = main(["profile", *TINY, *args, "--out", str(out)])
    assert code == 2
    assert fragment in _error_line(capsys)
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda(capsys):
    assert main(["profile", "--model", "tiny", "--device", "cuda"]) == 2
    assert "no usable CUDA GPU" in _error_line(capsys)


def test_unwritable_out_fails_before_the_run(tmp_path, capsys):
    assert main(["profile", *TINY, "--out", str(tmp_path / "nope" / "r.json")]) == 2
    assert "nope" in _error_line(capsys)
    assert main(["profile", *TINY, "--out", str(tmp_path / "r.pdf")]) == 2
    assert ".pdf" in _error_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_profile_prints_the_table_and_writes_each_format(tmp_path, capsys):
    for ext in ("json", "csv", "html"):
        out = tmp_path / f"r.{ext}"
        assert main(["profile", *TINY, "--precision", "fp32,bf16,tf32", "--out", str(out)]) == 0
        text = capsys.readouterr().out
        assert "Speed-up vs fp32" in text and "unsupported" in text
        assert out.stat().st_size > 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert {"schema_version", "environment", "config", "trials", "monitor_samples"} <= set(report)
    statuses = {t["precision"]: t["status"] for t in report["trials"]}
    assert statuses == {"fp32": "ok", "bf16": "ok", "tf32": "unsupported"}
    step = report["trials"][0]["steps"][0]
    assert {"step", "loss", "step_ms", "tokens_per_s", "tflops", "mfu", "allocated_bytes",
            "reserved_bytes", "loss_scale", "skipped", "grad_norm"} <= set(step)


def test_footprint_json_gives_gpt2_figures(capsys):
    assert main(["footprint", "--model", "gpt2", "--precision", "fp32,fp16,fp8", "--json"]) == 0
    rows = {r["precision"]: r for r in json.loads(capsys.readouterr().out)}
    assert round(rows["fp32"]["footprint_bytes"] / 2**20, 2) == 474.70
    assert round(rows["fp16"]["footprint_bytes"] / 2**20, 2) == 237.35
    assert rows["fp32"]["params"] == 124_439_808
    assert rows["fp8"]["status"] == "unsupported" and rows["fp8"]["footprint_bytes"] is None


def test_presets_and_version_through_main_py():
    run = subprocess.run([sys.executable, "main.py", "presets"], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert "124,439,808" in run.stdout and run.stderr == ""
    version = subprocess.run([sys.executable, "main.py", "--version"], cwd=ROOT,
                             capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("AmpScope ")
    bad = subprocess.run([sys.executable, "main.py", "profile", "--batch-size", "0"], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
