"""Which precision to train in on this device, with each reason citing a measured figure.

Inputs are plain dicts (as the report JSON holds them), so a report from a server can be
advised again in the window. A reason whose figure was not measured says so (figure
None) instead of borrowing a number from elsewhere.

Measured speed is judged by ``engine.record.compare.speed_verdict``: a noisy run is never
ranked, and a recommendation that goes against a significant measured ranking says
why in its reasons (otherwise the advice follows the measurement).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from engine.core.events import TrialResult, from_dict
from engine.record.compare import SpeedVerdict, speed_verdict
from engine.record.lab_results import Advice, Alternative, Reason

MEMORY_PRESSURE = 0.9  # a peak above this share of device memory counts as the constraint
QUANTISED = ("nf4", "int8")
GPU_CANDIDATES = ("fp32", "tf32", "fp16-amp", "bf16-amp")
CPU_CANDIDATES = ("fp32", "bf16-amp", "fp16-amp")


def _pct(x: float) -> str:
    return f"{100 * x:.3g}%"


def _pow2(x: float) -> str:
    return f"2^{math.log2(x):.0f}"


def _ok_trials(trials: list[dict] | None) -> dict[str, dict]:
    return {t["precision"]: t["summary"] for t in trials or ()
            if t.get("status") == "ok" and t.get("summary")}


def _tokens(ok: dict[str, dict], precision: str) -> float | None:
    return (ok.get(precision) or {}).get("tokens_per_s")


def _speed_reason(ok: dict[str, dict], chosen: str, others: tuple[str, ...]) -> Reason | None:
    mine = _tokens(ok, chosen)
    if mine is None:
        return None
    rivals = [(p, _tokens(ok, p)) for p in others if _tokens(ok, p) is not None]
    figure = ", ".join(f"{p} {t:,.0f} tokens/s" for p, t in [(chosen, mine), *rivals])
    return Reason(f"measured throughput of {chosen} against the alternatives", figure,
                  "profile trials")


def _verdict(trials: list[dict] | None, candidates: tuple[str, ...]) -> SpeedVerdict | None:
    """The speed verdict over the finished candidate trials; None below two of them."""
    measured = []
    for t in trials or ():
        if t.get("precision") in candidates and t.get("status") == "ok" and t.get("summary"):
            try:
                measured.append(from_dict(TrialResult, t))
            except (TypeError, KeyError, ValueError):
                return None  # a trial without its steps cannot be judged
    return speed_verdict(measured) if len(measured) >= 2 else None


def _noisy_warning(verdict: SpeedVerdict) -> Reason:
    return Reason("measured speeds are too noisy to rank, so the advice does not rest on them"
                  + (f" ({verdict.suggestion})" if verdict.suggestion else ""),
                  "; ".join(verdict.problems), "profile trials (engine/record/compare.py rule)")


def _fp16_risk(ok: dict[str, dict], grads: dict | None) -> Reason | None:
    """Measured evidence that fp16-amp's speed comes with numerical trouble, else None."""
    skipped = (ok.get("fp16-amp") or {}).get("skipped_steps")
    if skipped:
        return Reason("fp16-amp skipped steps for inf/NaN gradients: its loss scale had to "
                      "settle, and bf16 needs no loss scaling", f"{skipped} steps",
                      "profile trials")
    ratio = (grads or {}).get("overflow_ratio_fp16")
    if ratio is not None and ratio > 1:
        return Reason("fp16 overflows at the measured loss scale (largest scaled gradient above "
                      "fp16's max); bf16 has fp32's range", f"{ratio:.3g} x fp16 max",
                      "gradient statistics (one step)")
    return None


def _follow_measurement(pick: str, verdict: SpeedVerdict | None, ok: dict[str, dict],
                        grads: dict | None) -> tuple[str, Reason | None]:
    """The precision to recommend given the device's pick and the measured ranking, with the
    reason the measurement gives (agreeing, overruling, or overruled and why)."""
    if verdict is None or verdict.ranking is None:
        return pick, None
    fastest = verdict.ranking[0]
    if not any(pick in group for group in verdict.ranking):
        return pick, Reason(f"{pick} was not measured, so the measured ranking cannot confirm "
                            "or overrule it", verdict.text, "profile trials")
    if pick in fastest:
        return pick, Reason(f"{pick} measured among the fastest", verdict.text,
                            "profile trials (95% bootstrap CIs)")
    faster = fastest[0]
    risk = _fp16_risk(ok, grads) if faster == "fp16-amp" and pick.startswith("bf16") else None
    if risk is not None:
        return pick, Reason(f"{faster} measured faster, but {pick} is recommended anyway: "
                            + risk.text, f"{verdict.text}; {risk.figure}", risk.source)
    return faster, Reason(f"{faster} measured significantly faster than {pick}, the device's "
                          "usual fast path, on this model and shape, and no measured numerics "
                          "argue against it", verdict.text, "profile trials (95% bootstrap CIs)")


def _gradient_reasons(grads: dict, recommended: str) -> list[Reason]:
    under = grads.get("underflow_scale1") or {}
    out = []
    if under.get("fp16") is not None and under.get("bf16") is not None:
        out.append(Reason(
            "gradients that flush to zero when cast unscaled: bf16's exponent range is "
            "fp32's, fp16's is not" if recommended.startswith("bf16") else
            "gradients that flush to zero in fp16 without loss scaling",
            f"fp16 {_pct(under['fp16'])}, bf16 {_pct(under['bf16'])} of nonzero gradients",
            "gradient statistics (one step)",
        ))
    ratio, scale = grads.get("overflow_ratio_fp16"), grads.get("loss_scale")
    if ratio is not None and scale:
        out.append(Reason(
            f"largest gradient times the loss scale {_pow2(scale)} against fp16's max"
            + (": fp16 would overflow to inf and skip the step" if ratio > 1 else ""),
            f"{ratio:.3g} x fp16 max",
            "gradient statistics (one step)",
        ))
    return out


def _init_scale(grads: dict | None) -> tuple[float | None, Reason]:
    if not grads or grads.get("suggested_scale_max") is None:
        return None, Reason(
            "no gradient statistics: GradScaler starts at its default and adapts; run the "
            "numerics lab on this model for a measured initial scale", None, "not measured")
    lower, upper = grads["suggested_scale_min"], grads["suggested_scale_max"]
    # the largest scale that did not overflow protects most small gradients
    return upper, Reason(
        grads.get("suggestion_note") or "loss scales that neither overflow nor flush",
        f"{_pow2(lower)}..{_pow2(upper)}", "gradient statistics (one step)")


def _as_dict(grad_stats) -> dict | None:
    if grad_stats is None:
        return None
    return grad_stats if isinstance(grad_stats, dict) else dataclasses.asdict(grad_stats)


def advise(capabilities: dict, trials: list[dict] | None, grad_stats, model_dims: dict) -> Advice:
    """Recommend a precision for ``capabilities`` (kind, name, compute_capability,
    bf16_supported, fp8_supported, total_memory_bytes), citing the measured ``trials``
    (TrialResult dicts), ``grad_stats`` (GradientStats or its dict) and ``model_dims``
    (hidden, vocab)."""
    grads = _as_dict(grad_stats)
    ok = _ok_trials(trials)
    name = capabilities.get("name") or capabilities.get("kind", "device")
    cc = tuple(capabilities["compute_capability"]) if capabilities.get(
        "compute_capability") else None
    reasons: list[Reason] = []
    also: list[Alternative] = []
    warnings: list[Reason] = []
    init_scale = None
    bf16_max = torch.finfo(torch.bfloat16).max
    fp16_max = torch.finfo(torch.float16).max

    if capabilities.get("kind") == "cuda" and cc is not None:
        cc_text = f"{cc[0]}.{cc[1]}"
        device_reasons = []
        if cc >= (8, 0) and capabilities.get("bf16_supported", True):
            pick = "bf16-amp"
            device_reasons.append(Reason(f"{name} has bf16 Tensor Cores (compute capability "
                                         "8.0+)", cc_text, "device probe"))
            device_reasons.append(Reason("bf16 keeps fp32's exponent range, so no loss scaling "
                                         "is needed and no step is skipped for overflow",
                                         f"bf16 max {bf16_max:.3g} vs fp16 max {fp16_max:g}",
                                         "torch.finfo"))
        else:
            pick = "fp16-amp"
            device_reasons.append(Reason(f"{name} has no bf16 Tensor Cores (compute capability "
                                         "below 8.0): fp16 with dynamic loss scaling is its "
                                         "fast path", cc_text, "device probe"))
        verdict = _verdict(trials, GPU_CANDIDATES)
        recommended, measured = _follow_measurement(pick, verdict, ok, grads)
        if recommended == pick:
            reasons.extend(device_reasons)
        else:  # the measurement overruled the device's usual choice
            also.append(Alternative(pick, device_reasons[0]))
        if measured is not None:  # a measurement that disagrees comes first
            agrees = verdict.ranking is not None and recommended in verdict.ranking[0] \
                and recommended == pick
            reasons.insert(len(reasons) if agrees else 0, measured)
        if recommended == "fp16-amp":
            init_scale, scale_reason = _init_scale(grads)
            reasons.append(scale_reason)
        if grads:
            reasons.extend(_gradient_reasons(grads, recommended))
        if verdict is not None and verdict.noisy:
            warnings.append(_noisy_warning(verdict))
        else:
            speed = _speed_reason(ok, recommended, ("fp32", "fp16-amp", "bf16-amp"))
            if speed:
                reasons.append(speed)
        skipped = (ok.get("fp16-amp") or {}).get("skipped_steps")
        if recommended == "fp16-amp" and skipped:
            reasons.append(Reason("fp16-amp steps skipped for inf/NaN gradients while the "
                                  "scale settled", f"{skipped} steps", "profile trials"))
        hidden = model_dims.get("hidden")
        if cc >= (8, 9) and capabilities.get("fp8_supported") and hidden:
            if hidden % 16 == 0:
                fp8_speed = _tokens(ok, "fp8")
                also.append(Alternative("fp8", Reason(
                    "fp8 Tensor Cores (compute capability 8.9+) and a hidden size that is a "
                    "multiple of 16, as fp8 GEMMs need",
                    f"hidden {hidden}" + (f", fp8 {fp8_speed:,.0f} tokens/s" if fp8_speed
                                          else ""),
                    "model config" + (", profile trials" if fp8_speed else ""))))
            else:
                warnings.append(Reason("fp8 GEMMs need dimensions that are multiples of 16",
                                       f"hidden {hidden}", "model config"))
    else:
        verdict = _verdict(trials, CPU_CANDIDATES)
        speeds = ", ".join(f"{p} {_tokens(ok, p):,.0f} tokens/s" for p in CPU_CANDIDATES
                           if _tokens(ok, p) is not None)
        if verdict is not None and verdict.ranking is not None:
            fastest = verdict.ranking[0]
            recommended = "fp32" if "fp32" in fastest else fastest[0]  # fp32 wins a tie
            reasons.append(Reason(f"on this CPU {recommended} measured "
                                  + ("among the fastest (fp32 is the safe choice in a tie)"
                                     if len(fastest) > 1 else "fastest"),
                                  f"{verdict.text}; {speeds}",
                                  "profile trials (95% bootstrap CIs)"))
        elif verdict is not None:
            recommended = "fp32"
            reasons.append(Reason(
                "no precision measured significantly faster on this CPU, so fp32, the safe "
                "choice" if verdict.status == "tied" else "measured speeds on this CPU are too "
                "noisy to rank, so fp32, the safe choice", f"{verdict.text}; {speeds}",
                "profile trials (95% bootstrap CIs)"))
            if verdict.noisy:
                warnings.append(_noisy_warning(verdict))
        else:
            recommended = "fp32"
            reasons.append(Reason(
                "on a CPU bf16 pays off only with bf16 matrix units (AMX, AVX512-BF16); fp32 "
                "is the safe choice until a profile of fp32 and bf16-amp shows otherwise",
                None, "not measured"))
        if grads:
            reasons.extend(_gradient_reasons(grads, recommended))

    # Tensor Cores are a GPU's: on a CPU this alignment advice has nothing to speed up
    for dim in ("hidden", "vocab") if capabilities.get("kind") == "cuda" else ():
        value = model_dims.get(dim)
        if value and value % 8:
            warnings.append(Reason(
                f"{dim} size is not a multiple of 8: its GEMMs cannot use Tensor Cores at "
                "full speed; pad it to the next multiple of 8 (or 64)",
                f"{dim} {value}", "model config"))

    memory_reason = _memory_pressure(trials, ok, recommended, capabilities)
    if memory_reason:
        fitting = [p for p in QUANTISED if p in ok]
        if any(t.get("precision") == recommended and t.get("status") == "oom"
               for t in trials or ()) and fitting:
            recommended = min(fitting, key=lambda p: ok[p].get("peak_memory_bytes") or math.inf)
            init_scale = None
            reasons.insert(0, memory_reason)
        else:
            for p in QUANTISED:
                peak = (ok.get(p) or {}).get("peak_memory_bytes")
                also.append(Alternative(p, Reason(
                    memory_reason.text + f": {p} stores the frozen base in "
                    f"{'4' if p == 'nf4' else '8'} bits and trains LoRA adapters",
                    memory_reason.figure + (f"; {p} peak {peak / 2**30:.2f} GiB" if peak
                                            else ""),
                    memory_reason.source)))
    return Advice(recommended, init_scale, tuple(reasons), tuple(also), tuple(warnings))


def _memory_pressure(trials, ok, recommended, capabilities) -> Reason | None:
    """Why memory is the constraint, citing the measured peak or the OOM, else None."""
    for t in trials or ():
        if t.get("status") == "oom":
            return Reason(f"{t['precision']} ran out of memory", t.get("reason") or "OOM",
                          "profile trials")
    total = capabilities.get("total_memory_bytes")
    peak = (ok.get(recommended) or {}).get("peak_memory_bytes")
    if total and peak and peak > MEMORY_PRESSURE * total:
        return Reason(f"{recommended} peaks close to the device's memory",
                      f"{peak / 2**30:.2f} of {total / 2**30:.2f} GiB", "profile trials")
    return None
