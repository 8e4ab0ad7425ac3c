import dataclasses
import json

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from engine.core.recipes import recipe
from engine.measure.flops import blended_peak, count_flops
from engine.measure.peaks import PeakLookup
from engine.numerics.optrace import gemm_dims, trace_ops
from engine.record.lab_results import OpTrace

CPU = torch.device("cpu")


def _tiny(vocab: int = 256, embd: int = 64):
    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_head=2, n_embd=embd, vocab_size=vocab, n_positions=64,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    ids = torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(1))
    return GPT2LMHeadModel(config), {"input_ids": ids, "labels": ids}


def _outputs(trace: OpTrace, op: str, phase: str = "forward") -> set[str]:
    return {d for s in trace.ops if s.op == op and s.phase == phase for d in s.output_dtypes}


@pytest.mark.parametrize("precision,dtype", [("fp16-amp", torch.float16),
                                             ("bf16-amp", torch.bfloat16)])
def test_autocast_gemms_run_low_and_the_loss_stays_fp32(precision, dtype):
    model, batch = _tiny()
    trace = trace_ops(model, batch, recipe(precision), CPU)
    gemms = [s for s in trace.ops if s.op in ("aten.mm.default", "aten.addmm.default")]
    assert gemms and all(s.output_dtypes == (str(dtype),) for s in gemms)
    assert {s.phase for s in gemms} == {"forward", "backward"}
    assert _outputs(trace, "aten._log_softmax.default") == {"torch.float32"}
    assert _outputs(trace, "aten.nll_loss_forward.default") == {"torch.float32"}
    assert all(s.precision_sensitive for s in trace.ops if "nll_loss" in s.op)
    key = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    assert set(trace.flops_by_peak_dtype) == {key}
    json.dumps(dataclasses.asdict(trace))


def test_flops_match_flop_counter_mode():
    model, batch = _tiny()
    trace = trace_ops(model, batch, recipe("fp32"), CPU)
    counted = count_flops(lambda: model(**batch).loss.backward())
    assert trace.total_flops == counted.total > 0
    assert trace.flops_by_peak_dtype == counted.by_peak_dtype
    assert sum(s.flops_share for s in trace.ops if s.flops) == pytest.approx(1.0)


def test_gemms_with_dims_off_a_multiple_of_8_are_flagged():
    assert trace_ops(*_tiny(vocab=256), recipe("fp32"), CPU).flagged_gemms == ()
    flags = trace_ops(*_tiny(vocab=250), recipe("fp32"), CPU).flagged_gemms
    assert flags and all(250 in (f.m, f.n, f.k) for f in flags)
    assert all(f.multiple == 8 and "Tensor Cores" in f.reason for f in flags)
    assert {f.phase for f in flags} == {"forward", "backward"}


def test_gemm_dims_leave_out_batch_and_bias():
    a, b = torch.empty(3, 5, 7), torch.empty(3, 7, 9)
    assert gemm_dims("bmm", (a, b)) == (5, 9, 7)
    assert gemm_dims("addmm", (torch.empty(9), a[0], b[0])) == (5, 9, 7)
    assert gemm_dims("baddbmm", (torch.empty(3, 5, 9), a, b)) == (5, 9, 7)


def test_blended_peak_is_the_harmonic_mix():
    peaks = {"fp16": 100e12, "fp32": 10e12}
    mix = blended_peak({"fp16": 3e12, "fp32": 1e12},
                       lambda d: PeakLookup(peaks[d], f"table {d}", None))
    assert mix.flops_per_s == pytest.approx(4e12 / (3e12 / 100e12 + 1e12 / 10e12))
    assert mix.reason is None
    assert {p["dtype"]: p["share"] for p in mix.parts} == {"fp16": 0.75, "fp32": 0.25}


def test_blended_peak_is_none_when_a_dtype_has_no_peak():
    def lookup(d):
        return PeakLookup(1e12, "x", None) if d == "fp16" else PeakLookup(None, None, "no fp8")

    mix = blended_peak({"fp16": 1, "fp8": 1}, lookup)
    assert mix.flops_per_s is None and "fp8" in mix.reason and "no fp8" in mix.reason
    assert blended_peak({}, lookup).flops_per_s is None
