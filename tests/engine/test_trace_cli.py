"""``main.py trace FILE.json [--step-ms MS] [--json]``: the kernel table of a Chrome trace,
spawned as a user runs it, on the H200's real trace and on a trace recorded here in a
user's own loop (no AmpScope step range)."""

from __future__ import annotations

import copy
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


def _two_steps(one: Path, out: Path) -> Path:
    """The H200 trace's step twice, as tensorboard_trace_handler writes a schedule with
    active=2: each copy under a "ProfilerStep#N" range, the second 1 ms after the first, its
    launches and kernels linked by ids of their own."""
    raw = json.loads(one.read_text())
    timed = [e for e in raw["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    start, end = min(e["ts"] for e in timed), max(e["ts"] + e["dur"] for e in timed)
    ids = 1 + max(int(e.get("args", {}).get(k, 0)) for e in timed
                  for k in ("External id", "correlation"))
    (main,) = [e for e in timed if e["name"] == "ampscope:step" and e["cat"] == "user_annotation"]
    second = []
    for e in timed:
        e2 = copy.deepcopy(e)
        e2["ts"] += end - start + 1000
        for k in ("External id", "correlation"):
            if e2.get("args", {}).get(k):
                e2["args"][k] += ids
        second.append(e2)
    steps = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}",
              "pid": main["pid"], "tid": main["tid"], "ts": start + n * (end - start + 1000),
              "dur": end - start, "args": {}} for n in (0, 1)]
    raw["traceEvents"] += second + steps
    out.write_text(json.dumps(raw))
    return out


def test_a_trace_of_several_steps_is_weighed_as_one(h200, tmp_path):
    """Two profiled steps against one measured step were twice the kernel time (matmul
    51.7% of a 24.84 ms step, no idle time): the last step alone is analysed, and said."""
    union_ms, matmul_ms = _expected(h200)
    run = trace_cli(str(_two_steps(h200, tmp_path / "two.json")), "--step-ms", str(MEDIAN_MS),
                    "--json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["matmul_share"] == pytest.approx(matmul_ms / MEDIAN_MS)  # 25.9%
    assert out["idle_share"] == pytest.approx((MEDIAN_MS - union_ms) / MEDIAN_MS)
    assert out["kernel_busy_ms"] == pytest.approx(union_ms)
    assert out["trace_steps"] == 2 and out["step_analysed"] == "ProfilerStep#1"
    assert "ProfilerStep#1, the last of the trace's 2 profiled steps" in out["time_basis"]
    text = trace_cli(str(tmp_path / "two.json"), "--step-ms", str(MEDIAN_MS)).stdout
    assert "ProfilerStep#1, the last of the trace's 2 profiled steps" in text


def test_a_cpu_trace_the_tensorboard_handler_wrote_for_two_steps(tmp_path):
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    model = torch.nn.Sequential(torch.nn.Linear(16, 40), torch.nn.ReLU(), torch.nn.Linear(40, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=0, warmup=1, active=2, repeat=1),
                 on_trace_ready=tensorboard_trace_handler(str(tmp_path))) as prof:
        for _ in range(3):  # one warm-up step, two recorded
            model(torch.randn(8, 16)).sum().backward()
            opt.step()
            prof.step()
    (path,) = tmp_path.glob("*.json")
    events = json.loads(path.read_text())["traceEvents"]
    steps = sorted((e for e in events if str(e.get("name")).startswith("ProfilerStep#")
                    and e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    assert len(steps) == 2
    out = json.loads(trace_cli(str(path), "--json").stdout)
    assert out["trace_steps"] == 2 and out["step_analysed"] == steps[-1]["name"]
    assert out["step_ms"] == pytest.approx(steps[-1]["dur"] / 1e3)


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
