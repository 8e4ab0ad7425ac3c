"""The profiled step's shares are of the measured median step (the H200's real trace).

The profiled GPT-2 bf16-amp step took 61.8 ms, the measured median 24.84 ms; against the
measured step idle is 34.3% and matmuls about 25% (the old table said 73.6% and 10.4%).
The expected figures are computed here from the trace's own events.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from engine.core.config import RunConfig
from engine.measure.device import probe
from engine.measure.kernels import MATMUL, analyse_trace_file, format_profiled
from engine.measure.step_basis import against_measured, against_measured_steps
from engine.run.trial import run_trial

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "tests" / "data" / "h200-2026-11-27" / "trace" / \
    "gpt2-bf16-amp-b4x512.trace.json.gz"
# the measured median of that run's bf16-amp trial (reports/trace-run.json: 24.8358 ms)
MEDIAN_MS = 24.84
MATMUL_OPS = re.compile(r"aten::(mm|addmm|bmm|baddbmm|_cudnn_attention_(forward|backward)|"
                        r"_scaled_dot_product\w*|_flash_attention\w*|_efficient_attention\w*)$")


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("h200") / "step.trace.json"
    path.write_bytes(gzip.decompress(TRACE.read_bytes()))
    return path


def _expected(path: Path) -> tuple[float, float]:
    """(union of GPU work in ms, matmul kernels' ms) from the trace's events: a kernel is a
    matmul's when the innermost CPU op with its External id is a matmul op."""
    events = json.loads(path.read_text())["traceEvents"]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
           and e.get("dur", 0) > 0]
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in gpu)
    union, (start, end) = 0.0, spans[0]
    for a, b in spans[1:]:
        if a > end:
            union += end - start
            start, end = a, b
        end = max(end, b)
    union += end - start
    ops: dict[int, list[dict]] = {}
    for e in events:
        if e.get("cat") == "cpu_op" and "External id" in e.get("args", {}):
            ops.setdefault(e["args"]["External id"], []).append(e)
    matmul = 0.0
    for e in gpu:
        owners = ops.get(e["args"].get("External id"))
        if owners and MATMUL_OPS.match(min(owners, key=lambda o: o["dur"])["name"]):
            matmul += e["dur"]
    return union / 1e3, matmul / 1e3


def test_shares_are_of_the_measured_step_on_the_real_h200_trace(trace):
    union_ms, matmul_ms = _expected(trace)
    profiled = analyse_trace_file(str(trace), "cuda")
    assert profiled.step_ms == pytest.approx(61.75, abs=0.01)  # the profiled step's span
    ps = against_measured(profiled, MEDIAN_MS)
    assert ps.step_ms == MEDIAN_MS and ps.measured_step_ms == MEDIAN_MS
    assert ps.profiled_step_ms == profiled.step_ms
    assert ps.kernel_busy_ms == pytest.approx(union_ms, abs=1e-6)
    assert ps.idle_gap_share == pytest.approx((MEDIAN_MS - union_ms) / MEDIAN_MS, abs=1e-9)
    assert ps.idle_gap_share == pytest.approx(0.343, abs=0.001)
    assert ps.category_share[MATMUL] == pytest.approx(matmul_ms / MEDIAN_MS, rel=1e-9)
    assert ps.category_share[MATMUL] == pytest.approx(0.25, abs=0.01)
    assert ps.matmul_share_by_dtype["bfloat16"] == pytest.approx(matmul_ms / MEDIAN_MS)
    # the kernels' union is 34% short of the measured step: said, with which way
    assert "16.33 ms" in ps.basis_note and "-34%" in ps.basis_note
    assert "24.84 ms" in ps.time_basis


def test_the_odd_shape_hint_weighs_against_the_measured_step(trace):
    """Three GEMMs with GPT-2's 50,257-wide vocabulary: 3.9 ms, 15.8% of the real step."""
    ps = against_measured(analyse_trace_file(str(trace), "cuda"), MEDIAN_MS)
    odd = [g for g in ps.odd_gemms if 50257 in (g.m, g.n, g.k)]
    assert len(odd) == 3
    odd_ms = sum(g.ms for g in odd)
    assert odd_ms == pytest.approx(3.93, abs=0.01)
    text = format_profiled([type("T", (), {"precision": "bf16-amp", "profiled_step": ps,
                                           "status": "ok", "profiled_step_reason": None})()])
    assert f"{100 * odd_ms / MEDIAN_MS:.1f}% of the step" in text  # 15.8%


def test_within_tolerance_nothing_is_said(trace):
    profiled = analyse_trace_file(str(trace), "cuda")
    busy = profiled.step_ms - profiled.idle_gap_ms
    assert against_measured(profiled, busy * 1.05).basis_note is None
    slower = against_measured(profiled, busy * 0.8)  # kernels longer than the step
    assert slower.idle_gap_share is None and "longer" in slower.idle_gap_reason
    assert "+25%" in slower.basis_note


def _steps(times_ms):
    from engine.core.events import StepSample

    return [StepSample(precision="bf16-amp", step=i, warmup=False, loss=1.0, step_ms=ms,
                       tokens_per_s=None, tflops=None, mfu=None, allocated_bytes=None,
                       reserved_bytes=None, loss_scale=None, skipped=False, grad_norm=None,
                       time_s=float(i)) for i, ms in enumerate(times_ms)]


def test_kernels_a_hair_above_the_median_within_the_steps_spread_leave_no_idle(trace):
    """A GPU-bound step: the H200 step's kernel union (16.33 ms) 1% above the median of
    steps that spread 2% either side is the timer's noise, not kernels that ran longer:
    idle is 0, with the spread said; above the steps' p90 it stays n/a."""
    profiled = analyse_trace_file(str(trace), "cuda")
    busy = profiled.step_ms - profiled.idle_gap_ms
    median = busy / 1.01
    steps = _steps([median * f for f in (0.97, 0.98, 0.99, 1.0, 1.0, 1.01, 1.02, 1.03)])
    ps = against_measured_steps(profiled, steps)
    assert ps.measured_step_ms == pytest.approx(median)
    assert ps.idle_gap_ms == 0.0 and ps.idle_gap_share == 0.0 and ps.idle_gap_reason is None
    assert "within the measured steps' spread" in ps.time_basis and "p90" in ps.time_basis
    tight = _steps([median * f for f in (0.997, 0.998, 0.999, 1.0, 1.0, 1.001, 1.002)])
    over = against_measured_steps(profiled, tight)
    assert over.idle_gap_share is None and "longer" in over.idle_gap_reason
    assert "p90" in over.idle_gap_reason


def test_a_cpu_trial_compares_its_profiled_step_with_its_measured_median():
    config = RunConfig(model="tiny", batch_size=1, seq_len=16, steps=3, warmup=1,
                       device="cpu", isolation="inline")
    result = run_trial(config, "fp32", probe("cpu"), lambda _: None, lambda: False)
    ps = result.profiled_step
    assert ps.measured_step_ms == result.summary.median_step_ms
    assert ps.profiled_step_ms == ps.step_ms  # a CPU run's shares stay the profiled step's
    off = abs(ps.step_ms - ps.measured_step_ms) / ps.measured_step_ms
    assert (ps.basis_note is not None) == (off > 0.10)


def test_a_faster_cpu_profiled_step_blames_no_gpu():
    """A CPU step profiled 20% under the measured median: the steps varied, no GPU waited."""
    import dataclasses

    from engine.core.events import ProfiledStep

    fields = {f.name: None for f in dataclasses.fields(ProfiledStep)
              if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    cpu = dataclasses.replace(ProfiledStep(**fields), step_ms=80.0, idle_gap_ms=None)
    ps = against_measured(cpu, 100.0)
    assert "-20%" in ps.basis_note and "100.00 ms" in ps.basis_note
    assert "GPU" not in ps.basis_note and "ran slower" in ps.basis_note
    slower = against_measured(dataclasses.replace(cpu, step_ms=130.0), 100.0)
    assert "+30%" in slower.basis_note and "profiler slowed it" in slower.basis_note


def test_the_html_report_shows_the_shares_of_the_measured_step(trace, tmp_path):
    """The real run's report with its trial's profiled step read from its real trace."""
    import dataclasses

    from engine.record.json_report import read_json
    from engine.report.html import render_html

    report = tmp_path / "trace-run.json"
    report.write_bytes(gzip.decompress((TRACE.parents[1] / "reports" /
                                        "trace-run.json.gz").read_bytes()))
    record = read_json(report)
    trial = record.trial("bf16-amp")
    median = trial.summary.median_step_ms
    assert median == pytest.approx(MEDIAN_MS, abs=0.005)
    ps = against_measured(analyse_trace_file(str(trace), "cuda"), median)
    record.trials[record.trials.index(trial)] = dataclasses.replace(trial, profiled_step=ps)
    page = render_html(record)
    assert "profiled vs measured step" in page and "16.33 ms" in page
    assert f"{100 * ps.idle_gap_share:.1f}%" in page
