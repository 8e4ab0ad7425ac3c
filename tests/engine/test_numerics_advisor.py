import torch

from engine.core.events import StepSample, TrialResult, TrialSummary, to_dict
from engine.numerics.advisor import advise
from engine.record.spread import step_spread


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


TOKENS = 1000


def _clean(step_ms, n=20):
    """Step times within +-1% of ``step_ms``: a quiet machine."""
    return [step_ms * (1 + 0.01 * ((i * 7) % 5 - 2) / 2) for i in range(n)]


def _noisy(step_ms, n=20):
    """Step times swinging from 0.5x to 1.6x: a busy machine."""
    return [step_ms * (0.5, 1.6, 0.8, 1.3)[i % 4] for i in range(n)]


def _measured(precision, step_times, skipped=0):
    """A finished trial dict with real step samples, as the profile run writes it."""
    steps = [StepSample(precision, i, False, 2.0, ms, TOKENS / (ms / 1e3), None, None, None,
                        None, None, i < skipped, None if i < skipped else 1.0, float(i))
             for i, ms in enumerate(step_times)]
    median = sorted(step_times)[len(step_times) // 2]
    summary = TrialSummary(len(steps), median, TOKENS / (median / 1e3), None, None, "cpu", None,
                           None, None, "n/a", skipped, 2.0, None,
                           spread=step_spread(steps, TOKENS))
    return to_dict(TrialResult(precision, "ok", steps=steps, summary=summary))


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


def test_cpu_follows_a_significant_measured_speed():
    faster_bf16 = [_measured("fp32", _clean(100.0)), _measured("bf16-amp", _clean(60.0))]
    advice = advise(CPU, faster_bf16, None, DIMS)
    assert advice.recommended == "bf16-amp"
    assert "bf16-amp > fp32" in advice.reasons[0].figure
    assert "16,667 tokens/s" in advice.reasons[0].figure  # 1000 tokens / 60 ms
    slower_bf16 = [_measured("fp32", _clean(100.0)), _measured("bf16-amp", _clean(250.0))]
    assert advise(CPU, slower_bf16, None, DIMS).recommended == "fp32"


def test_cpu_does_not_rank_noisy_speeds():
    # bf16-amp's median is 5% faster, but its steps swing 0.5x..1.6x: the CI of the ratio
    # is that wide, includes 1, and nothing is ranked on it
    noisy = [_measured("fp32", _clean(100.0)), _measured("bf16-amp", _noisy(95.0))]
    advice = advise(CPU, noisy, None, DIMS)
    assert advice.recommended == "fp32"
    assert "no precision measured significantly faster" in advice.reasons[0].text


def test_gpu_follows_a_measured_ranking_that_disagrees_with_the_device():
    # an A100 would get bf16-amp, but fp16-amp measured significantly faster, no step was
    # skipped and no gradient statistics warn: the advice follows the measurement
    trials = [_measured("fp32", _clean(300.0)), _measured("bf16-amp", _clean(120.0)),
              _measured("fp16-amp", _clean(100.0))]
    advice = advise(_cuda((8, 0)), trials, None, DIMS)
    assert advice.recommended == "fp16-amp"
    assert "measured significantly faster than bf16-amp" in advice.reasons[0].text
    assert "fp16-amp > bf16-amp > fp32" in advice.reasons[0].figure
    assert [a.precision for a in advice.also_try] == ["bf16-amp"]


def test_gpu_keeps_bf16_against_the_measurement_only_saying_why():
    trials = [_measured("bf16-amp", _clean(120.0)),
              _measured("fp16-amp", _clean(100.0), skipped=3)]
    advice = advise(_cuda((8, 0)), trials, None, DIMS)
    assert advice.recommended == "bf16-amp"
    why = advice.reasons[0]
    assert why.text.startswith("fp16-amp measured faster, but bf16-amp is recommended anyway")
    assert "skipped" in why.text and "3 steps" in why.figure
    # the gradient statistics are a reason too: fp16 overflows at the measured scale
    advice = advise(_cuda((8, 0)), trials[:1] + [_measured("fp16-amp", _clean(100.0))], GRADS,
                    DIMS)
    assert advice.recommended == "bf16-amp"
    assert "2.5 x fp16 max" in advice.reasons[0].figure


def test_gpu_does_not_rank_noisy_speeds():
    # as fast, with steps swinging 0.5x..1.6x: the ratio's CI includes 1, nothing is ranked
    trials = [_measured("bf16-amp", _noisy(95.0)), _measured("fp16-amp", _clean(100.0))]
    advice = advise(_cuda((8, 0)), trials, None, DIMS)
    assert advice.recommended == "bf16-amp"
    assert not any("significantly faster" in r.text for r in advice.reasons)


def test_odd_dimensions_warn_and_block_fp8():
    advice = advise(_cuda((9, 0)), None, None, {"hidden": 1000, "vocab": 50257})
    texts = " ".join(w.figure for w in advice.warnings)
    assert "vocab 50257" in texts and "hidden 1000" in texts
    assert advice.also_try == ()


def test_no_tensor_core_advice_on_a_cpu():
    dims = {"hidden": 1004, "vocab": 50257}  # both off the multiple of 8
    on_gpu = advise(_cuda((9, 0)), None, None, dims)
    assert sum("Tensor Cores" in w.text for w in on_gpu.warnings) == 2
    on_cpu = advise(CPU, None, None, dims)
    assert not any("Tensor Core" in r.text for r in (*on_cpu.warnings, *on_cpu.reasons))


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
