import torch

from engine.numerics.advisor import advise


def _cuda(cc, memory=80 * 2**30):
    return {"kind": "cuda", "name": "Test GPU", "compute_capability": list(cc),
            "bf16_supported": tuple(cc) >= (8, 0), "fp8_supported": tuple(cc) >= (8, 9),
            "total_memory_bytes": memory}


CPU = {"kind": "cpu", "name": "Test CPU", "compute_capability": None, "bf16_supported": True,
       "fp8_supported": False, "total_memory_bytes": None}
DIMS = {"hidden": 1024, "vocab": 32000}
GRADS = {
    "loss_scale": 2.0**16,
    "underflow_scale1": {"fp16": 0.004, "bf16": 0.0, "fp8_e4m3": 0.5, "fp8_e5m2": 0.02},
    "overflow_ratio_fp16": 2.5,
    "suggested_scale_min": 2.0**3,
    "suggested_scale_max": 2.0**14,
    "suggestion_note": "scales 2^3..2^14 fit",
}


def _trial(precision, tokens_per_s, status="ok", peak=None, skipped=0):
    return {"precision": precision, "status": status, "reason": None if status == "ok" else
            "CUDA out of memory", "summary": {"tokens_per_s": tokens_per_s,
                                              "peak_memory_bytes": peak,
                                              "skipped_steps": skipped} if status == "ok"
            else None}


def _figures(advice):
    return " ".join(r.figure or "" for r in advice.reasons)


def test_hopper_gets_bf16_amp_citing_measured_gradient_figures():
    advice = advise(_cuda((9, 0)), None, GRADS, DIMS)
    assert advice.recommended == "bf16-amp" and advice.init_scale is None
    figures = _figures(advice)
    assert "0.4%" in figures and "2.5 x fp16 max" in figures
    assert f"{torch.finfo(torch.bfloat16).max:.3g}" in figures
    assert [a.precision for a in advice.also_try] == ["fp8"]
    assert advice.warnings == ()


def test_turing_gets_fp16_amp_with_the_measured_initial_scale():
    advice = advise(_cuda((7, 5)), [_trial("fp16-amp", 900.0, skipped=3)], GRADS, DIMS)
    assert advice.recommended == "fp16-amp"
    assert advice.init_scale == GRADS["suggested_scale_max"]
    assert "2^3..2^14" in _figures(advice)
    assert "3 steps" in _figures(advice)
    assert advice.also_try == ()  # no fp8 before compute capability 8.9


def test_fp16_without_gradient_statistics_says_the_scale_was_not_measured():
    advice = advise(_cuda((7, 0)), None, None, DIMS)
    assert advice.init_scale is None
    assert any(r.figure is None and r.source == "not measured" for r in advice.reasons)


def test_cpu_without_trials_picks_fp32_and_says_nothing_was_measured():
    advice = advise(CPU, None, None, DIMS)
    assert advice.recommended == "fp32"
    assert advice.reasons[0].figure is None


def test_cpu_follows_the_measured_speed():
    faster_bf16 = [_trial("fp32", 1000.0), _trial("bf16-amp", 1500.0)]
    advice = advise(CPU, faster_bf16, None, DIMS)
    assert advice.recommended == "bf16-amp"
    assert "1,500 tokens/s" in advice.reasons[0].figure
    assert "1,000 tokens/s" in advice.reasons[0].figure
    slower_bf16 = [_trial("fp32", 1000.0), _trial("bf16-amp", 400.0)]
    assert advise(CPU, slower_bf16, None, DIMS).recommended == "fp32"


def test_odd_dimensions_warn_and_block_fp8():
    advice = advise(_cuda((9, 0)), None, None, {"hidden": 1000, "vocab": 50257})
    texts = " ".join(w.figure for w in advice.warnings)
    assert "vocab 50257" in texts and "hidden 1000" in texts
    assert advice.also_try == ()


def test_memory_pressure_suggests_quantised_training():
    trials = [_trial("bf16-amp", None, status="oom"), _trial("nf4", 300.0, peak=6 * 2**30)]
    advice = advise(_cuda((8, 0), memory=8 * 2**30), trials, None, DIMS)
    assert advice.recommended == "nf4"
    assert advice.reasons[0].source == "profile trials"
    near_full = [_trial("bf16-amp", 2000.0, peak=int(7.5 * 2**30))]
    advice = advise(_cuda((8, 0), memory=8 * 2**30), near_full, None, DIMS)
    assert advice.recommended == "bf16-amp"
    assert {a.precision for a in advice.also_try} == {"nf4", "int8"}
    assert "7.50 of 8.00 GiB" in advice.also_try[0].reason.figure
