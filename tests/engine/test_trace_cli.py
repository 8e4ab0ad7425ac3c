"""``main.py trace FILE.json [--step-ms MS] [--json]``: the kernel table of a Chrome trace,
spawned as a user runs it, on the H200's real trace and on a trace recorded here in a
user's own loop (no AmpScope step range)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.engine.test_step_basis import MEDIAN_MS, TRACE, _expected

ROOT = Path(__file__).resolve().parents[2]


def trace_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "main.py", "trace", *args], cwd=ROOT,
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def h200(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("h200") / "gpt2-bf16-amp.trace.json"
    path.write_bytes(gzip.decompress(TRACE.read_bytes()))
    return path


def _gpu_span_ms(path: Path) -> float:
    events = json.loads(path.read_text())["traceEvents"]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
           and e.get("dur", 0) > 0]
    return (max(e["ts"] + e["dur"] for e in gpu) - min(e["ts"] for e in gpu)) / 1e3


def test_json_shares_are_of_the_measured_step(h200):
    union_ms, matmul_ms = _expected(h200)
    run = trace_cli(str(h200), "--step-ms", str(MEDIAN_MS), "--json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["device"] == "cuda" and out["measured_step_ms"] == MEDIAN_MS
    assert out["idle_share"] == pytest.approx((MEDIAN_MS - union_ms) / MEDIAN_MS)
    assert out["idle_share"] == pytest.approx(0.343, abs=0.001)
    assert out["matmul_share"] == pytest.approx(matmul_ms / MEDIAN_MS)
    assert out["kernel_busy_ms"] == pytest.approx(union_ms)
    assert {"elementwise_share", "copy_share", "optimizer_share"} <= set(out)
    # the vocabulary's GEMMs weighed against the real step, and what padding changes
    assert "50,257" in out["padding_hint"] and "50,304" in out["padding_hint"]
    assert "15.8% of the step" in out["padding_hint"]


def test_text_without_the_step_is_of_the_profiled_step(h200):
    union_ms, _ = _expected(h200)
    span = _gpu_span_ms(h200)
    run = trace_cli(str(h200), "--json")
    out = json.loads(run.stdout)
    assert out["measured_step_ms"] is None
    assert out["idle_share"] == pytest.approx((span - union_ms) / span)  # 73.6%: the old one
    text = trace_cli(str(h200)).stdout
    assert "give --step-ms" in text and "Kernels, most time first" in text
    assert "cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align1" in text


def test_text_with_the_step_names_the_padding(h200):
    run = trace_cli(str(h200), "--step-ms", "24.84")
    assert run.returncode == 0, run.stderr
    assert "shares of the measured step, 24.84 ms" in run.stdout
    assert "15.8% of the step" in run.stdout and "pad_to_multiple_of=64" in run.stdout
    assert "-34% against the measured median step" in run.stdout


def test_a_trace_a_user_recorded_in_their_own_loop(tmp_path):
    from torch.profiler import ProfilerActivity, profile

    model = torch.nn.Sequential(torch.nn.Linear(16, 40), torch.nn.ReLU(), torch.nn.Linear(40, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
    path = tmp_path / "mine.json"
    prof.export_chrome_trace(str(path))
    run = trace_cli(str(path), "--json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["device"] == "cpu" and out["idle_share"] is None
    assert out["matmul_share"] > 0 and out["profiled_step"]["matmul_share_by_dtype"] == {
        "float32": pytest.approx(out["matmul_share"])}


@pytest.mark.parametrize(("content", "fragment"), [
    (None, "trace not found"),
    (b"not json at all", "is not JSON"),
    (b'{"schema_version": 1, "trials": []}', "is not a torch.profiler Chrome trace"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, content, fragment):
    path = tmp_path / "t.json"
    if content is not None:
        path.write_bytes(content)
    run = trace_cli(str(path))
    assert run.returncode == 2 and run.stdout == ""
    assert len(run.stderr.strip().splitlines()) == 1 and fragment in run.stderr


def test_a_step_time_that_is_not_one_is_refused(h200):
    run = trace_cli(str(h200), "--step-ms", "0")
    assert run.returncode == 2 and "--step-ms" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
