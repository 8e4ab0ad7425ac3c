"""What the real ``python3 main.py`` process prints: refusals before torch loads, progress
as it goes, a table that fits 120 columns, CSV ranges as two numbers."""

import csv
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_in_process import run_cli

ROOT = Path(__file__).resolve().parents[2]


def _env(tmp_path) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "AMPSCOPE_DATA_DIR": str(tmp_path / "data")}


def _run(args, tmp_path, merged=False, importtime=False) -> subprocess.CompletedProcess:
    flags = ["-X", "importtime"] if importtime else []
    return subprocess.run([sys.executable, *flags, "main.py", *args], cwd=ROOT, text=True,
                          stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT if merged else subprocess.PIPE,
                          env=_env(tmp_path), timeout=300)


@pytest.mark.parametrize("command", ["profile", "footprint", "numerics", "fit"])
def test_a_precision_typo_is_refused_before_torch_is_imported(command, tmp_path):
    run = _run([command, "--precision", "fp33"], tmp_path, importtime=True)
    assert run.returncode == 2
    assert run.stdout == ""
    # -X importtime writes one line per imported module to stderr: torch must not be one
    timings = [line for line in run.stderr.splitlines() if line.startswith("import time:")]
    imported = {line.rsplit("|", 1)[1].strip() for line in timings[1:]}
    assert "json" in imported  # the check itself sees imports
    assert "torch" not in imported and "transformers" not in imported
    said = [line for line in run.stderr.splitlines() if not line.startswith("import time:")]
    assert said == ["ampscope: error: unknown precision 'fp33': choose from fp32, tf32, "
                    "fp16-amp, bf16-amp, fp16, bf16, int8, nf4, fp8, fp8-rowwise, "
                    "fp8-rowwise-gw-hp, mxfp8, nvfp4, fp8-fsdp-ag"]


def test_presets_says_each_preset_before_the_table(tmp_path):
    names = [p["name"] for p in
             json.loads((ROOT / "resources" / "presets.json").read_text())["presets"]]
    run = _run(["presets"], tmp_path, merged=True)
    assert run.returncode == 0
    lines = run.stdout.splitlines()
    progress = [lines.index(f"[{i}/{len(names)}] {n}") for i, n in enumerate(names, 1)]
    table = [i for i, line in enumerate(lines) if re.match(r"\S+ +[\d,]+ params ", line)]
    assert len(table) == len(names)
    assert max(progress) < min(table)  # progress came as it went, the table after
    # stdout alone is only the table (or JSON): progress stays on stderr (here the command
    # line in this process: the order of the two streams was the spawned run's above)
    js = run_cli("presets", "--json")
    assert [p["name"] for p in json.loads(js.stdout)] == names
    assert f"[1/{len(names)}] {names[0]}" in js.stderr


def test_footprint_progress_and_what_nf4_really_stores(tmp_path):
    run = _run(["footprint", "--model", "tiny", "--precision", "fp32,int8,nf4",
                "--device", "cpu"], tmp_path, merged=True)
    assert run.returncode == 0, run.stdout
    lines = run.stdout.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("precision ")))
    for i, p in enumerate(("fp32", "int8", "nf4"), 1):
        assert lines.index(f"[{i}/3] loading tiny as {p}...") < header
    rows = {line.split()[0]: line for line in lines[header + 1:] if line[:4] in ("fp32", "int8",
                                                                                   "nf4 ")}
    # what bitsandbytes hangs on the nf4 weights: absmax and the code book, no SCB
    from engine.models.load import load_model

    net = load_model("tiny", "nf4", "cpu", 0, False, train=False).model
    states = [p.quant_state for p in net.parameters() if getattr(p, "quant_state", None)]
    assert states and not any(hasattr(p, "SCB") for p in net.parameters())
    assert all(getattr(s, "state2", None) is None for s in states)  # no nested state here
    nbytes = {t.data_ptr(): t.nbytes for s in states for t in (s.absmax, s.code)}
    assert f"quantisation state {sum(nbytes.values()) / 2**20:.2f} MiB (absmax, quant map)" \
        in rows["nf4"]
    assert "SCB" not in rows["nf4"]
    assert rows["int8"].endswith("(SCB)")
    assert "quantisation state" not in rows["fp32"]


def test_numerics_says_each_stage_before_the_lab(tmp_path):
    run = _run(["numerics", "--model", "tiny", "--batch-size", "1", "--seq-len", "16",
                "--device", "cpu"], tmp_path, merged=True)
    assert run.returncode == 0, run.stdout
    lines = run.stdout.splitlines()
    title = next(i for i, line in enumerate(lines) if line.startswith("AmpScope numerics lab"))
    stages = [i for i, line in enumerate(lines) if line.startswith("numerics: ")]
    assert len(stages) == 5 and max(stages) < title
    assert lines[stages[0]] == "numerics: loading tiny as fp16-amp..."


def _table(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Precision"))
    end = next(i for i, line in enumerate(lines) if line.startswith("speed:"))
    return lines[start:end]


def test_profile_table_fits_120_columns_and_csv_ranges_are_two_numbers(tmp_path, monkeypatch):
    # the figures and text of the command line, run in this process (spawned ``profile``:
    # test_cli_spread; spawned ``report``: test_cli_lost_updates)
    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path / "data"))
    out = tmp_path / "r.csv"
    run = run_cli("profile", "--model", "tiny", "--precision", "fp32,bf16-amp,tf32,nf4",
                  "--batch-size", "1", "--seq-len", "16", "--steps", "5", "--warmup", "1",
                  "--device", "cpu", "--isolation", "inline", "--interleave", "off", "--quiet",
                  "--out", str(out))
    assert run.returncode == 0, run.stderr
    table = _table(run.stdout)
    assert max(len(line) for line in table) <= 120, "\n".join(table)
    with out.open(newline="") as fh:
        steps = list(csv.DictReader(fh))
    median = {p: statistics.median(float(s["step_ms"]) for s in steps
                                   if s["precision"] == p and s["warmup"] == "False")
              for p in ("fp32", "bf16-amp", "nf4")}
    ratio = median["fp32"] / median["bf16-amp"]
    bf16_row = next(line for line in table if line.startswith("bf16-amp "))
    assert f" {ratio:.2f}x [" in bf16_row
    assert any(line.startswith("  nf4 trained LoRA adapters only") for line in table)
    assert any(line.startswith("  tf32: ") for line in table)  # why it did not run
    comparison = tmp_path / "r.comparison.csv"
    assert f"report written to {out} (steps) and {comparison} (comparison table)" in run.stdout
    with comparison.open(newline="") as fh:
        rows = {r["precision"]: r for r in csv.DictReader(fh)}
    low, high = float(rows["bf16-amp"]["speedup_ci_low"]), float(rows["bf16-amp"]
                                                                 ["speedup_ci_high"])
    assert low <= ratio <= high
    assert f"[{low:.2f}..{high:.2f}]" in bf16_row
    assert float(rows["fp32"]["step_ms_p10"]) <= median["fp32"] <= float(rows["fp32"]
                                                                          ["step_ms_p90"])
    assert rows["tf32"]["speedup_ci_low"] == rows["tf32"]["speedup_ci_high"] == ""
    assert ".." not in "".join(v for r in rows.values() for v in r.values()
                               if v and v[0].isdigit())

    # the run's journal into a CSV again: report names both files it writes
    journal = next((tmp_path / "data" / "runs").glob("*.jsonl"))
    again = tmp_path / "again.csv"
    rep = run_cli("report", str(journal), "--out", str(again))
    assert rep.returncode == 0, rep.stderr
    assert rep.stdout.strip().endswith(
        f"written to {again} (steps) and {tmp_path / 'again.comparison.csv'} (comparison table)")


def test_wide_gives_every_column():
    run = run_cli("profile", "--model", "tiny", "--precision", "fp32", "--batch-size", "1",
                  "--seq-len", "16", "--steps", "2", "--warmup", "0", "--device", "cpu",
                  "--isolation", "inline", "--quiet", "--no-kernel-profile", "--wide")
    assert run.returncode == 0, run.stderr
    header = _table(run.stdout)[0]
    for column in ("Trained params", "Step p10..p90", "Step CV", "Throughput 95% CI",
                   "MFU (model FLOPs)", "HFU (hardware FLOPs)", "Energy/token vs fp32"):
        assert column in header
