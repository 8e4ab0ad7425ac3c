"""The CLI's lines on hardware FLOPs by the dtype each trial's matmuls ran in.

The blended peak divides by this mix (engine/measure/flops.py), so a reader sees which share ran
in fp8, mxfp8 or bf16, and which trials ran their format emulated (engine/measure/gating.py).
"""

from __future__ import annotations


def _gflop(flops: int) -> str:
    return f"{flops / 1e9:,.3g} GFLOP"


def flops_by_dtype_lines(trials) -> list[str]:
    rows = []
    for t in trials:
        label = t.precision + (" (emulated)" if t.support == "emulated" else "")
        if t.flops is None or not t.flops.by_peak_dtype:
            rows.append((label, f"n/a: {t.status}" + (f" ({t.reason.split(':')[0]})"
                                                      if t.status != "ok" and t.reason else "")))
            continue
        total = sum(t.flops.by_peak_dtype.values())
        mix = ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in
                        sorted(t.flops.by_peak_dtype.items(), key=lambda kv: -kv[1]))
        rows.append((label, f"{_gflop(t.flops.counted_per_step)}: {mix}"))
    if not rows:
        return []
    width = max(len(label) for label, _ in rows)
    return ["Hardware FLOPs per step by the dtype that ran (FlopCounterMode; the blended "
            "peak weighs these)", *(f"  {label:<{width}}  {text}" for label, text in rows)]
