"""The memory timeline drawn: the HTML report's chart (from a real CLI report), the GPU
levels beside it (H200 recorded fields), and the plan's traced timeline (Llama 3 8B on an
RTX 4090, and a plan beside a measured trial)."""

import dataclasses
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine.core.events import MemoryBreakdown, from_dict
from engine.record.journal import read_run
from engine.record.memory_timeline_series import trial_series
from engine.report.charts import memory_timeline_chart
from tests.cli_in_process import run_cli

ROOT = Path(__file__).resolve().parents[2]
H200 = json.loads((ROOT / "tests/data/h200/bf16_amp_memory.json").read_text())


def _spawn(tmp_path, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AMPSCOPE_DATA_DIR": str(tmp_path / "data")}
    return subprocess.run([sys.executable, "main.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.fixture
def cli(tmp_path, monkeypatch):
    """The command in this process (its output is the subject), journaling in tmp_path."""
    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path / "data"))
    return run_cli


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("timeline")
    out = tmp / "r.json"
    run = _spawn(tmp, "profile", "--model", "tiny", "--precision", "fp32,bf16-amp",
                 "--batch-size", "2", "--seq-len", "32", "--steps", "1", "--warmup", "0",
                 "--no-kernel-profile", "--quiet", "--isolation", "inline", "--out", str(out))
    assert run.returncode == 0, run.stderr
    return out


def _texts(svg: str) -> list[str]:
    return [re.sub(r"<[^>]+>", "", t).strip() for t in re.findall(r"<text[^>]*>.*?</text>",
                                                                 svg, re.S)]


def test_the_html_report_draws_each_precision_on_one_byte_axis(report, tmp_path, cli):
    run = cli("report", str(report), "--out", str(tmp_path / "r.html"))
    assert run.returncode == 0, run.stderr
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "Memory across one training step, by category" in page
    record = read_run(str(report))
    chart = memory_timeline_chart(record)
    texts = _texts(chart.svg)
    # the two precisions' rows, the categories they held, the phases, each peak's label
    assert any(t.startswith("fp32") for t in texts) and any(t.startswith("bf16-amp")
                                                            for t in texts)
    for word in ("parameters", "optimizer state", "activations", "gradients", "weight copies",
                 "forward", "backward", "optimizer"):
        assert word in texts, word
    peaks = sorted(t for t in texts if t.startswith("peak "))
    expected = sorted(f"peak {t.memory.total_bytes / 2**20:.2f} MiB" for t in record.trials)
    assert peaks == expected
    assert "the trial ran on the CPU" in chart.note  # no card memory to mark
    assert "data:image/png;base64" in chart.svg  # the areas are rasterised: a small report
    assert len(chart.svg) < 150_000


def test_a_gpu_trial_draws_the_card_the_allocator_and_nvml_beside_the_stack(report):
    record = read_run(str(report))
    trial = record.trials[0]
    gpu = from_dict(MemoryBreakdown, H200["memory"])
    # the H200 run has no timeline: a CPU trial's real one, under the GPU's recorded fields
    trial = dataclasses.replace(trial, memory=gpu)
    drawn = trial_series(trial, H200["environment"])
    levels = {lv.key: lv.bytes for lv in drawn.levels}
    device = H200["environment"]["device"]
    assert levels == {"usable": device["total_memory_bytes"] - gpu.context_gap_bytes,
                      "allocated": gpu.peak_allocated_bytes,
                      "reserved": gpu.peak_reserved_bytes, "nvml": gpu.nvml_process_bytes}
    chart = memory_timeline_chart(dataclasses.replace(record, trials=[trial],
                                                      environment=H200["environment"]))
    texts = _texts(chart.svg)
    for label in ("card usable (CUDA's figure - measured context)",
                  "allocator allocated (peak, measured steps)",
                  "allocator reserved (peak, measured steps)", "NVML process memory"):
        assert label in texts
    # one byte axis up to the card: its ticks reach GiB
    assert "(GiB)" in " ".join(texts)


def _phases(timeline: dict) -> list[str]:
    return [k for k, _ in itertools.groupby(p["phase"] for p in timeline["points"])]


def test_plan_traces_llama3_8b_on_an_rtx_4090_with_its_timeline(tmp_path, cli):
    # the default plan: scaled from cut models, its timeline extended to the 32 layers
    # (--no-levers: the answer's changes, traced again at 8B's widths, draw no timeline)
    run = cli("plan", "--model", "llama-3-8b", "--precision", "bf16-amp",
              "--batch-size", "1", "--seq-len", "2048", "--card", "RTX 4090",
              "--max-batch", "0", "--json", "--quiet", "--no-levers",
              "--out", str(tmp_path / "plan.html"))
    assert run.returncode == 0, run.stderr
    trial = json.loads(run.stdout)["trials"][0]
    assert trial["scaling"].startswith("scaled"), trial["scaling"]
    timeline, memory = trial["memory_timeline"], trial["memory"]
    totals = [sum(p["category_bytes"]) for p in timeline["points"]]
    assert max(totals) == memory["total_bytes"] == timeline["peak_bytes"]
    at_peak = dict(zip(timeline["categories"],
                       timeline["points"][timeline["peak_index"]]["category_bytes"]))
    assert at_peak == {c: memory[f"{c}_bytes"] for c in timeline["categories"]}
    assert _phases(timeline) == ["forward", "backward", "optimizer", "zero_grad"]
    # 32 decoder layers, each named where its forward made the bytes
    layers = {p["module"].split(".")[2] for p in timeline["points"]
              if p["module"] and p["module"].startswith("model.layers.")}
    assert len(layers) > 16 and layers <= {str(i) for i in range(32)}
    page = (tmp_path / "plan.html").read_text(encoding="utf-8")
    assert "Memory across one training step (traced)" in page
    assert "NVIDIA GeForce RTX 4090 usable" in _texts(page)


def test_plan_measured_draws_the_measured_step_on_the_traced_axes(report, tmp_path, cli):
    run = cli("plan", "--model", "tiny", "--precision", "bf16-amp",
              "--batch-size", "2", "--seq-len", "32", "--card", "RTX 4090", "--max-batch",
              "0", "--measured", str(report), "--json", "--quiet",
              "--out", str(tmp_path / "plan.html"))
    assert run.returncode == 0, run.stderr
    trial = json.loads(run.stdout)["trials"][0]
    assert trial["measured"]["memory_timeline"]["peak_bytes"] == \
        trial["measured"]["memory"]["total_bytes"]
    texts = _texts((tmp_path / "plan.html").read_text(encoding="utf-8"))
    run_id = read_run(str(report)).run_id
    assert f"measured total (run {run_id})" in texts
    assert "aten ops into the traced step (a measured step scaled to the same length)" in texts
