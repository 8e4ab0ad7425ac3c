"""Which precision to train in on this device, with each reason citing a measured figure.

Inputs are plain dicts (as the report JSON holds them), so a report from a server can be
advised again in the window. A reason whose figure was not measured says so (figure
None) instead of borrowing a number from elsewhere.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

MEMORY_PRESSURE = 0.9  # a peak above this share of device memory counts as the constraint
QUANTISED = ("nf4", "int8")


@dataclass(frozen=True)
class Reason:
    text: str
    figure: str | None  # the number the reason rests on, with its unit; None: not measured
    source: str  # where the figure comes from


@dataclass(frozen=True)
class Alternative:
    precision: str
    reason: Reason


@dataclass(frozen=True)
class Advice:
    recommended: str
    init_scale: float | None  # GradScaler initial scale, for fp16 recommendations
    reasons: tuple[Reason, ...]
    also_try: tuple[Alternative, ...]
    warnings: tuple[Reason, ...]


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
        if cc >= (8, 0) and capabilities.get("bf16_supported", True):
            recommended = "bf16-amp"
            reasons.append(Reason(f"{name} has bf16 Tensor Cores (compute capability 8.0+)",
                                  cc_text, "device probe"))
            reasons.append(Reason("bf16 keeps fp32's exponent range, so no loss scaling is "
                                  "needed and no step is skipped for overflow",
                                  f"bf16 max {bf16_max:.3g} vs fp16 max {fp16_max:g}",
                                  "torch.finfo"))
        else:
            recommended = "fp16-amp"
            reasons.append(Reason(f"{name} has no bf16 Tensor Cores (compute capability below "
                                  "8.0): fp16 with dynamic loss scaling is its fast path",
                                  cc_text, "device probe"))
            init_scale, scale_reason = _init_scale(grads)
            reasons.append(scale_reason)
        if grads:
            reasons.extend(_gradient_reasons(grads, recommended))
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
        fp32_speed, bf16_speed = _tokens(ok, "fp32"), _tokens(ok, "bf16-amp")
        if fp32_speed is not None and bf16_speed is not None:
            recommended = "bf16-amp" if bf16_speed > fp32_speed else "fp32"
            reasons.append(Reason(
                f"on this CPU {recommended} measured faster",
                f"bf16-amp {bf16_speed:,.0f} tokens/s, fp32 {fp32_speed:,.0f} tokens/s",
                "profile trials"))
        else:
            recommended = "fp32"
            reasons.append(Reason(
                "on a CPU bf16 pays off only with bf16 matrix units (AMX, AVX512-BF16); fp32 "
                "is the safe choice until a profile of fp32 and bf16-amp shows otherwise",
                None, "not measured"))
        if grads:
            reasons.extend(_gradient_reasons(grads, recommended))

    for dim in ("hidden", "vocab"):
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
