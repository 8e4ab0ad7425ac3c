"""Trace replay: a Kineto/Chrome trace of one H100 bf16-amp step (tests/data/README.md)
through the analysis that ``--trace`` runs use, checked against figures computed here
straight from the trace's events."""

import json
import os
from pathlib import Path

import pytest
import torch

from engine.measure.kernels import (
    MATMUL,
    UNATTRIBUTED,
    _calls_from,
    analyse,
    analyse_trace_file,
    profile_step,
    recorded_dtypes,
)

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "kineto" / "h100_bf16_amp_step.trace.json"
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
# the test's own verdicts for the fixture's matmul kernels (by name, not by the app's rules)
TENSOR_CORE = ("nvjet_", "flash::flash_fwd_kernel")
OFF_TENSOR_CORE = ("_ffma_",)
NOT_MATMUL = ("splitKreduce_kernel",)


def _events():
    return json.loads(FIXTURE.read_text())["traceEvents"]


def _device(events):
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS]


def _owner_names(events):
    """External id -> the name of the CPU event carrying it."""
    return {e["args"]["External id"]: e["name"] for e in events
            if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")}


def _idle_us(device):
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in device)
    idle, end = 0.0, spans[0][1]
    for start, stop in spans[1:]:
        idle += max(0.0, start - end)
        end = max(end, stop)
    return spans[-1][1] - spans[0][0], idle


@pytest.fixture(scope="module")
def step():
    return analyse_trace_file(str(FIXTURE), "cuda")


def test_every_kernel_counts_once_and_the_shares_sum_to_one(step):
    device = _device(_events())
    busy_us = sum(e["dur"] for e in device)
    span_us, idle_us = _idle_us(device)
    assert step.step_ms == pytest.approx(span_us / 1e3)
    assert step.idle_gap_ms == pytest.approx(idle_us / 1e3)
    assert sum(step.category_ms.values()) == pytest.approx(busy_us / 1e3)
    assert sum(k.ms for k in step.kernels) == pytest.approx(busy_us / 1e3)
    assert sum(step.category_share.values()) + step.idle_gap_share == pytest.approx(1.0)


def test_kernels_without_an_enclosing_op_are_unattributed(step):
    events = _events()
    owners = _owner_names(events)
    loose = [e for e in _device(events)
             if owners.get(e["args"].get("External id")) in (None, "ampscope:step")]
    assert len(loose) == 2  # the fixture's fill kernel and memset
    assert step.category_ms[UNATTRIBUTED] == pytest.approx(sum(e["dur"] for e in loose) / 1e3)
    rows = [k for k in step.kernels if k.op == UNATTRIBUTED]
    assert {k.name for k in rows} == {e["name"] for e in loose}


def test_triton_kernel_under_a_non_aten_op_keeps_its_time(step):
    events = _events()
    owners = _owner_names(events)
    triton = [e for e in _device(events) if e["name"].startswith("triton_")]
    assert len(triton) == 2  # a pointwise kernel and a template GEMM
    assert triton
    for e in triton:
        op = owners[e["args"]["External id"]]
        assert not op.startswith("aten::")
        (row,) = [k for k in step.kernels if k.name == e["name"]]
        assert (row.op, row.ms) == (op, pytest.approx(e["dur"] / 1e3))
    categories = {o.op: o.category for o in step.ops if o.op.startswith("triton_")}
    assert categories == {"triton_poi_fused_add_cos_sin_0": "elementwise/normalisation",
                          "triton_tem_fused_mm_0": MATMUL}


def test_tensor_core_share_and_matmul_dtypes(step):
    events = _events()
    device = _device(events)
    on = sum(e["dur"] for e in device if any(t in e["name"] for t in TENSOR_CORE))
    off = sum(e["dur"] for e in device if any(t in e["name"] for t in OFF_TENSOR_CORE))
    assert step.tensor_core_share == pytest.approx(on / (on + off))
    helper = [k for k in step.kernels if any(t in k.name for t in NOT_MATMUL)]
    assert helper and all(k.tensor_core is None for k in helper)
    # matmul time by the dtype of the op that launched it; the split-K reduction belongs to
    # its bf16 aten::mm; the Triton template's range records no dtype
    owners = {e["args"]["External id"]: e for e in events
              if e.get("ph") == "X" and e.get("cat") == "cpu_op"}
    dtype_of = {"c10::BFloat16": "bfloat16", "float": "float32"}
    busy = sum(e["dur"] for e in device) + _idle_us(device)[1]
    expected: dict[str, float] = {}
    for e in device:
        op = owners.get(e["args"].get("External id"))
        if op and op["name"] in ("aten::addmm", "aten::mm", "triton_tem_fused_mm_0",
                                 "aten::_scaled_dot_product_flash_attention"):
            d = dtype_of.get(op["args"].get("Input type", ["?"])[0], "unknown")
            expected[d] = expected.get(d, 0.0) + e["dur"] / busy
    assert step.matmul_share_by_dtype == {k: pytest.approx(v) for k, v in expected.items()}
    assert step.category_ms[MATMUL] == pytest.approx(sum(expected.values()) * busy / 1e3)


def test_trace_loader_matches_torch_profiler_events(tmp_path):
    """The same CPU profile through torch's own event tree and through the trace file."""
    from torch.profiler import ProfilerActivity, profile, record_function

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(8, 16)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with record_function("ampscope:step"):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(x).float().pow(2).mean()
            loss.backward()
            opt.step()
    path = tmp_path / "step.trace.json"
    prof.export_chrome_trace(str(path))
    events = prof.events()  # with dtypes as profile_step reads them (torch 2.11 included)
    calls, step_us, _ = _calls_from(events, recorded_dtypes(prof, events))
    live = analyse(calls, "cpu", step_us)
    replay = analyse_trace_file(str(path), "cpu")
    key = sorted((o.op, o.dtype, o.category, o.calls) for o in live.ops)
    assert key == sorted((o.op, o.dtype, o.category, o.calls) for o in replay.ops)
    assert replay.step_ms == pytest.approx(live.step_ms, abs=0.01)
    for a, b in zip(sorted(live.ops, key=lambda o: (o.op, o.dtype)),
                    sorted(replay.ops, key=lambda o: (o.op, o.dtype)), strict=True):
        assert b.self_ms == pytest.approx(a.self_ms, abs=0.01)


def test_profile_step_with_a_trace_file_analyses_that_file(tmp_path):
    model = torch.nn.Linear(8, 8)
    trace = tmp_path / "p.trace.json"
    result = profile_step(lambda: model(torch.randn(4, 8)).sum().backward(),
                          torch.device("cpu"), 0, trace_file=str(trace))
    again = analyse_trace_file(str(trace), "cpu")
    assert [(o.op, o.calls, o.self_ms) for o in result.ops] == \
        [(o.op, o.calls, o.self_ms) for o in again.ops]
    # on the CPU the timed step records its inputs: the trace carries the dtypes it was
    # analysed with
    assert [o.dtype for o in again.ops] == [o.dtype for o in result.ops]
    assert {o.dtype for o in result.ops if o.op in ("aten::mm", "aten::addmm")} == {"float32"}
    assert result.trace_file == str(trace)


@pytest.mark.skipif(not os.environ.get("AMPSCOPE_REAL_TRACE"),
                    reason="set AMPSCOPE_REAL_TRACE to a Kineto trace you recorded")
def test_a_real_recorded_trace():
    path = os.environ["AMPSCOPE_REAL_TRACE"]
    raw = json.loads(Path(path).read_text())
    device = _device(raw["traceEvents"] if isinstance(raw, dict) else raw)
    ps = analyse_trace_file(path, "cuda")
    assert sum(ps.category_ms.values()) == pytest.approx(sum(e["dur"] for e in device) / 1e3)
    assert sum(ps.category_share.values()) + ps.idle_gap_share == pytest.approx(1.0)


def test_profile_text_names_the_unattributed_time_and_the_left_out_matmuls(step):
    from types import SimpleNamespace

    from engine.measure.kernels import format_profiled

    trial = SimpleNamespace(precision="bf16-amp", status="ok", profiled_step=step,
                            profiled_step_reason=None)
    text = format_profiled([trial])
    share = step.category_share[UNATTRIBUTED]
    assert f"{100 * share:.1f}% of the step in kernels no CPU op enclosed" in text
    # a Triton template GEMM: a matmul whose name cannot say Tensor Core or not
    template_us = sum(e["dur"] for e in _device(_events()) if e["name"].startswith("triton_tem_"))
    assert template_us > 0
    assert f"{template_us / 1e3:.3f} ms of matmul kernels left out" in text
    assert "on TC (Tensor Core share of matmul time) n/a" not in text
