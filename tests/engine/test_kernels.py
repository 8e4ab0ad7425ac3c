import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from engine.core.config import RunConfig
from engine.core.events import TrialResult, from_dict, to_dict
from engine.core.recipes import recipe
from engine.measure.device import probe
from engine.measure.kernel_names import tensor_core_kernel
from engine.measure.kernels import MATMUL, OPTIMIZER, SCALER, analyse, category
from engine.measure.op_calls import DeviceSpan, OpCall, idle_gaps_us
from engine.models.load import load_model, make_batches
from engine.numerics.optrace import GEMM_OPS, trace_ops
from engine.run.trial import run_trial

ROOT = Path(__file__).resolve().parents[2]
GEMMS = {f"aten::{name}" for name in GEMM_OPS}


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> str:
    """A second model family: a 2-layer Llama from a config folder (random weights)."""
    from transformers import LlamaConfig

    folder = tmp_path_factory.mktemp("tiny-llama")
    LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=128).save_pretrained(folder)
    return str(folder)


def _trial(model: str, precision: str, **kw) -> TrialResult:
    config = RunConfig(model=model, precisions=(precision,), batch_size=2, seq_len=16, steps=1,
                       warmup=0, device="cpu", isolation="inline", **kw)
    return run_trial(config, precision, probe("cpu"), lambda _: None, lambda: False)


def _gemm_dtypes_by_optrace(model: str, precision: str) -> set[str]:
    """The dtypes the numerics lab's dispatch-mode trace sees the GEMMs run in."""
    rec = recipe(precision)
    loaded = load_model(model, rec, "cpu", 0)
    batch = make_batches(loaded.config, loaded.task, 2, 16, 1, 0, "cpu")[0]
    trace = trace_ops(loaded.model, batch, rec, "cpu")
    return {s.input_dtypes[0].removeprefix("torch.") for s in trace.ops
            if s.op.split(".")[1] in GEMM_OPS}


@pytest.mark.parametrize("precision", ["bf16-amp", "fp32"])
@pytest.mark.parametrize("family", ["tiny", "llama"])
def test_profiled_step_names_aten_matmuls_in_the_autocast_dtype(precision, family, tiny_llama):
    model = "tiny" if family == "tiny" else tiny_llama
    result = _trial(model, precision)
    assert result.status == "ok", result.reason
    ps = result.profiled_step
    assert ps is not None, result.profiled_step_reason
    gemms = [o for o in ps.ops if o.op in GEMMS]
    assert gemms and all(o.category == MATMUL for o in gemms)
    expected = "bfloat16" if precision == "bf16-amp" else "float32"
    forward_backward = {o.dtype for o in gemms}
    assert expected in forward_backward
    assert forward_backward == _gemm_dtypes_by_optrace(model, precision)
    assert ps.matmul_share_by_dtype[expected] > 0
    # the shares are of the profiled step's wall time, op self times summed by category
    total_ms = sum(o.self_ms for o in ps.ops)
    assert sum(v for k, v in ps.category_ms.items() if k != "outside aten ops") == \
        pytest.approx(total_ms)
    assert sum(ps.category_ms.values()) == pytest.approx(ps.step_ms)
    assert ps.category_share[OPTIMIZER] > 0
    assert ps.idle_gap_ms is None and "CPU" in ps.idle_gap_reason
    assert ps.tensor_core_share is None and "CPU" in ps.tensor_core_reason
    # measured steps are untouched: the profiled step is an extra one
    assert len([s for s in result.steps if not s.warmup]) == 1


def test_odd_gemm_shapes_are_the_ones_the_numerics_lab_flags():
    config = RunConfig(model="tiny", precisions=("bf16-amp",), batch_size=3, seq_len=15,
                       steps=1, warmup=0, device="cpu", isolation="inline")
    result = run_trial(config, "bf16-amp", probe("cpu"), lambda _: None, lambda: False)
    odd = result.profiled_step.odd_gemms
    assert odd and all(g.tensor_core is None for g in odd)  # no Tensor Cores on a CPU
    rec = recipe("bf16-amp")
    loaded = load_model("tiny", rec, "cpu", 0)
    batch = make_batches(loaded.config, loaded.task, 3, 15, 1, 0, "cpu")[0]
    flagged = trace_ops(loaded.model, batch, rec, "cpu").flagged_gemms
    assert {(g.m, g.n, g.k) for g in odd} == {(g.m, g.n, g.k) for g in flagged}
    assert any(g.m == 45 for g in odd)  # 3 x 15 tokens


def test_grad_scaler_time_is_its_own_category():
    ps = _trial("tiny", "fp16-amp").profiled_step
    scaler_ops = {o.op for o in ps.ops if o.category == SCALER}
    assert "aten::_amp_foreach_non_finite_check_and_unscale_" in scaler_ops
    assert "aten::_amp_update_scale_" in scaler_ops
    assert ps.category_ms[SCALER] > 0


def test_profiled_step_survives_the_json_report():
    result = _trial("tiny", "fp32")
    back = from_dict(TrialResult, json.loads(json.dumps(to_dict(result))))
    assert back.profiled_step == result.profiled_step
    old = to_dict(result)
    del old["profiled_step"], old["profiled_step_reason"]  # a report from before this field
    assert from_dict(TrialResult, old).profiled_step is None


def test_html_report_shows_the_profiled_step(tmp_path):
    from engine.record.run_record import RunRecord
    from engine.report.html import render_html

    result = _trial("tiny", "bf16-amp")
    page = render_html(RunRecord(trials=[result], status="ok"))
    assert "Time by dtype: one extra profiled step" in page
    mm = next(o for o in result.profiled_step.ops if o.op == "aten::mm")
    assert f"<td>aten::mm</td><td>{mm.dtype}</td>" in page
    assert "no Tensor Cores" in page


def test_turned_off_says_why():
    result = _trial("tiny", "fp32", profile_step=False)
    assert result.profiled_step is None
    assert "--no-kernel-profile" in result.profiled_step_reason


def test_category_rules():
    def call(name, *ancestors):
        return OpCall(name, ancestors, ("float",), 1.0)

    assert category(call("aten::addmm")) == MATMUL
    assert category(call("aten::_scaled_dot_product_flash_attention_for_cpu")) == MATMUL
    assert category(call("aten::gelu")) == "elementwise/normalisation"
    assert category(call("aten::native_layer_norm")) == "elementwise/normalisation"
    assert category(call("aten::_to_copy")) == "copy/cast"
    assert category(call("aten::mul_", "aten::_foreach_mul_", "Optimizer.step#AdamW.step",
                         "ampscope:grad_scaler")) == OPTIMIZER
    assert category(call("aten::mul_", "ampscope:grad_scaler")) == SCALER


def test_tensor_core_names():
    on = ["sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1",
          "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn>",
          "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn",
          "sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x16_stage4",
          "nvjet_sm90_hss_320x128_64x3_2x1_v_bz_coopA_NNT"]
    off = ["ampere_sgemm_128x64_nn", "void gemv2T_kernel_val<int, int, float, float>",
           "cutlass_80_simt_sgemm_128x128_8x4_nn_align1",
           "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_stage3",
           "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernel>"]
    assert all(tensor_core_kernel(n) for n in on)
    assert not any(tensor_core_kernel(n) for n in off)


def test_gpu_analysis_on_recorded_kernels():
    """The CUDA path of the analysis, fed the records a GPU profile would give."""
    tc, simt, gelu = ("sm90_xmma_gemm_bf16bf16_bf16f32", "ampere_sgemm_128x64_nn",
                      "vectorized_elementwise_kernel<GeluCUDAKernel>")
    calls = [
        OpCall("aten::addmm", (), ("c10::BFloat16",) * 3, 50.0,
               ((tc, 300.0), (tc, 100.0))),
        OpCall("aten::mm", (), ("float", "float"), 40.0, ((simt, 100.0),),
               shapes=((45, 128), (128, 384))),
        OpCall("aten::gelu", (), ("c10::BFloat16",), 10.0, ((gelu, 50.0),)),
        OpCall("aten::_foreach_add_", ("Optimizer.step#AdamW.step",), ("float",), 5.0,
               (("multi_tensor_apply_kernel", 50.0),)),
    ]
    spans = [DeviceSpan(0, 300), DeviceSpan(300, 400), DeviceSpan(450, 550),
             DeviceSpan(600, 650), DeviceSpan(700, 750)]
    ps = analyse(calls, "cuda", step_wall_us=10_000.0, spans=spans)
    assert ps.step_ms == pytest.approx(0.75)  # first kernel start to last kernel end
    assert ps.idle_gap_ms == pytest.approx((50 + 50 + 50) / 1e3)
    assert ps.tensor_core_share == pytest.approx(400 / 500)
    assert ps.matmul_share_by_dtype == {"bfloat16": pytest.approx(400 / 750),
                                        "float32": pytest.approx(100 / 750)}
    assert ps.category_share[OPTIMIZER] == pytest.approx(50 / 750)
    (odd,) = ps.odd_gemms  # linked to its kernel: off Tensor Cores
    assert (odd.m, odd.n, odd.k, odd.tensor_core) == (45, 384, 128, False)
    assert "M=45" in odd.reason
    kernels = {k.name: k for k in ps.kernels}
    assert kernels[tc].calls == 2 and kernels[tc].tensor_core is True
    assert kernels[simt].tensor_core is False and kernels[gelu].tensor_core is None


def test_idle_gaps_with_overlapping_kernels():
    span, idle = idle_gaps_us([DeviceSpan(0, 10), DeviceSpan(5, 20), DeviceSpan(30, 40)])
    assert (span, idle) == (40, 10)


def test_profile_trace_writes_valid_chrome_trace_json(tmp_path):
    trace_dir = tmp_path / "traces"
    done = subprocess.run(
        [sys.executable, "main.py", "profile", "--model", "tiny", "--precision", "fp32,bf16-amp",
         "--batch-size", "1", "--seq-len", "16", "--steps", "1", "--warmup", "0",
         "--device", "cpu", "--isolation", "inline", "--quiet", "--trace", str(trace_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "matmul by dtype" in done.stdout
    # on the CPU the one profiled step records the dtypes, and the table names them
    table = done.stdout[done.stdout.index("matmul by dtype"):]
    assert "float32" in table.split("fp32", 1)[1] and "bfloat16" in table
    for precision in ("fp32", "bf16-amp"):
        path = trace_dir / f"{precision}.trace.json"
        data = json.loads(path.read_text())  # the Chrome trace event format
        events = data["traceEvents"]
        assert isinstance(events, list) and events
        complete = [e for e in events if e.get("ph") == "X"]
        assert all({"name", "ts", "dur", "pid", "tid"} <= set(e) for e in complete)
        names = {e["name"] for e in complete}
        assert "ampscope:step" in names and "aten::mm" in names
        # on the CPU one step, timed, with its inputs and the allocator's events recorded
        assert sum(e["name"] == "ampscope:step" for e in complete) == 1
        mm = [e for e in complete if e["name"] == "aten::mm"]
        assert mm and all(e["args"].get("Input type") for e in mm)
        assert any(e["name"] == "[memory]" for e in events)
    assert not list(trace_dir.glob("*.pickle"))  # memory snapshots are CUDA only


def test_bad_trace_folder_is_one_line_and_exit_2(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    done = subprocess.run(
        [sys.executable, "main.py", "profile", "--model", "tiny", "--device", "cpu",
         "--trace", str(blocker / "sub")], cwd=ROOT, capture_output=True, text=True,
        timeout=600)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--trace" in lines[0]


@pytest.mark.gpu
def test_cuda_profiled_step_kernels_tensor_cores_and_snapshot(tmp_path):
    config = RunConfig(model="gpt2", precisions=("bf16-amp",), batch_size=4, seq_len=256,
                       steps=2, warmup=1, device="cuda", isolation="inline",
                       trace_dir=str(tmp_path))
    result = run_trial(config, "bf16-amp", probe("cuda"), lambda _: None, lambda: False)
    ps = result.profiled_step
    assert ps is not None, result.profiled_step_reason
    assert ps.kernels and ps.idle_gap_ms is not None and ps.idle_gap_ms >= 0
    assert ps.tensor_core_share is not None and ps.tensor_core_share > 0.5
    assert ps.matmul_share_by_dtype.get("bfloat16", 0) > 0
    assert ps.peak_memory_bytes > 0
    snapshot = pickle.loads(Path(ps.memory_snapshot_file).read_bytes())
    assert "segments" in snapshot and "device_traces" in snapshot
    json.loads(Path(ps.trace_file).read_text())


def test_live_profiler_events_attribute_kernels_to_any_op_and_keep_the_rest():
    """The CUDA path of ``_calls_from`` on torch's own FunctionEvent objects, as a GPU
    profile gives them: kernels hang on the CPU event their correlation id links to. On a
    torch whose FunctionEvent has no ``input_dtypes`` / ``linked_correlation_id`` (2.11)
    the events are built without them, and the profiler's dtype records stand in."""
    import inspect

    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    from engine.measure.kernels import UNATTRIBUTED, _calls_from

    accepts = inspect.signature(FunctionEvent.__init__).parameters
    records = {}  # what kineto_dtypes gives such a torch: dtypes by correlation id

    def cpu(i, name, start, end, parent=None, dtypes=None, annotation=False):
        extra = {"input_dtypes": dtypes or []} if "input_dtypes" in accepts else {}
        records[i] = dtypes or []
        e = FunctionEvent(i, name, thread=1, start_us=start, end_us=end,
                          is_user_annotation=annotation, **extra)
        if parent is not None:
            e.set_cpu_parent(parent)
            parent.append_cpu_child(e)
        return e

    def gpu(name, start, end, owner):
        if owner is not None:
            owner.append_kernel(name, 0, end - start)
        link = owner.id if owner is not None else 0
        extra = {"linked_correlation_id": link} if "linked_correlation_id" in accepts else {}
        return FunctionEvent(0, name, thread=7, start_us=start, end_us=end,
                             device_type=DeviceType.CUDA, **extra)

    step = cpu(1, "ampscope:step", 0, 1000, annotation=True)
    mm = cpu(2, "aten::mm", 10, 20, step, ["c10::BFloat16", "c10::BFloat16"])
    bnb = cpu(3, "bitsandbytes::int8_linear_matmul", 30, 40, step, ["signed char"] * 2)
    triton = cpu(4, "triton_poi_fused_add_0", 50, 60, step, annotation=True)
    device = [gpu("nvjet_tst_96x64_64x10_1x2_h_bz_bias_TNN", 100, 300, mm),
              gpu("sm80_xmma_gemm_i8f32_i8i32_f32_tn_n_tilesize32x64x64", 300, 350, bnb),
              gpu("triton_poi_fused_add_0", 350, 370, triton),
              gpu("void at::native::vectorized_elementwise_kernel<FillFunctor>", 400, 410, step),
              gpu("Memset (Device)", 410, 415, None)]
    calls, step_us, spans = _calls_from([step, mm, bnb, triton, *device], records)
    assert {c.name for c in calls} == {"aten::mm", "bitsandbytes::int8_linear_matmul",
                                       "triton_poi_fused_add_0"}
    ps = analyse(calls, "cuda", step_us, spans)
    dur = [e.time_range.elapsed_us() for e in device]
    total = sum(dur) + (device[3].time_range.start - device[2].time_range.end)  # one gap
    by_op = {k.op: k for k in ps.kernels}
    assert by_op["bitsandbytes::int8_linear_matmul"].ms == pytest.approx(dur[1] / 1e3)
    assert ps.category_ms[MATMUL] == pytest.approx((dur[0] + dur[1]) / 1e3)
    assert ps.matmul_share_by_dtype == {"bfloat16": pytest.approx(dur[0] / total),
                                        "int8": pytest.approx(dur[1] / total)}
    assert ps.category_ms["elementwise/normalisation"] == pytest.approx(dur[2] / 1e3)
    assert ps.category_ms[UNATTRIBUTED] == pytest.approx((dur[3] + dur[4]) / 1e3)
    assert ps.idle_gap_ms * 1e3 == pytest.approx(total - sum(dur))
    assert sum(ps.category_share.values()) + ps.idle_gap_share == pytest.approx(1.0)
