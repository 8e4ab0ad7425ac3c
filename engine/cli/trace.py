"""``python3 main.py trace FILE.json [--step-ms MS] [--json]``: the kernel table of any
torch.profiler Chrome trace, one ``profile --trace`` wrote or one recorded in a user's own
training (``export_chrome_trace``, ``tensorboard_trace_handler``; ``.json`` or
``.json.gz``), by the same analysis as a profiled trial (``engine.measure.kernels``).

A profiler slows a step's host side, so with ``--step-ms`` (the step's time measured
without the profiler) the shares are of that step: idle = it minus the union of kernel
time (``engine.measure.step_basis``). A trace of several profiled steps is analysed as its
last step alone (``engine.measure.trace_steps``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

SHARES = {"idle_share": None, "matmul_share": "matmul",
          "elementwise_share": "elementwise/normalisation", "copy_share": "copy/cast",
          "optimizer_share": "optimizer", "grad_scaler_share": "GradScaler",
          "grad_norm_share": "grad norm", "other_share": "other",
          "unattributed_share": "unattributed", "outside_ops_share": "outside aten ops"}
TOP_KERNELS = 10


def add_parser(sub) -> None:
    p = sub.add_parser("trace", help="the kernel table of a torch.profiler Chrome trace "
                                     "(one 'profile --trace' wrote, or your own)")
    p.add_argument("file", help="a Chrome trace (.json or .json.gz) as torch.profiler's "
                                "export_chrome_trace or tensorboard_trace_handler writes it")
    p.add_argument("--step-ms", type=float, metavar="MS",
                   help="the step's time measured without the profiler: shares are of it "
                        "(idle = it minus the union of kernel time)")
    p.add_argument("--json", action="store_true", help="print JSON")


def _load(path: Path) -> dict:
    """The trace's analysed events, streamed and checked (``engine.measure.trace_read``);
    every failure is one ValueError that says what to do."""
    from engine.measure.trace_read import read_trace

    raw = read_trace(path)
    if not any(e["cat"] == "cpu_op" for e in raw["traceEvents"]):
        raise ValueError(f"{path} is not a torch.profiler Chrome trace (no CPU op events): "
                         "record one with prof.export_chrome_trace('trace.json')")
    return raw


def analyse_file(path: Path, step_ms: float | None):
    """(the ProfiledStep of the trace, the device kind it ran on, the step analysed where the
    trace holds several, else None)."""
    from engine.measure.trace_steps import last_step

    raw, step = last_step(_load(path))  # read and checked before torch loads: a bad file is
    # refused at once
    from engine.measure.kernels import _calls_from, analyse, trace_events_of
    from engine.measure.step_basis import against_measured

    events = raw["traceEvents"] if isinstance(raw, dict) else raw
    kind = "cuda" if any(isinstance(e, dict) and e.get("cat") == "kernel" for e in events) \
        else "cpu"
    try:
        calls, step_us, spans = _calls_from(trace_events_of(raw))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: an event of the trace is damaged ({exc!r}): record it "
                         "again") from None
    if not step_us:  # a user's trace has no AmpScope step range: its step's, or the ops' wall
        step_us = step.wall_us if step else _wall_us(events)
    ps = against_measured(analyse(calls, kind, step_us, spans), step_ms)
    if step:
        ps = dataclasses.replace(ps, time_basis=f"{step.said()}; {ps.time_basis}")
    return ps, kind, step


def _wall_us(events) -> float:
    cpu = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"
           and e.get("cat") == "cpu_op"]
    return max(float(e["ts"]) + float(e["dur"]) for e in cpu) - min(float(e["ts"]) for e in cpu)


def shares(ps) -> dict:
    """The shares of the step by name (``idle_share``, ``matmul_share``, ...)."""
    out = {}
    for key, category in SHARES.items():
        if category is None:
            out[key] = ps.idle_gap_share
        elif category in ps.category_share:
            out[key] = ps.category_share[category]
    return out


def _json(path: Path, ps, kind: str, step) -> str:
    from engine.core.events import to_dict
    from engine.measure.padding import padding_hint

    return json.dumps({
        "file": str(path), "device": kind, "step_ms": ps.step_ms,
        "measured_step_ms": ps.measured_step_ms, "profiled_step_ms": ps.profiled_step_ms,
        "kernel_busy_ms": ps.kernel_busy_ms, **shares(ps),
        "matmul_share_by_dtype": ps.matmul_share_by_dtype,
        "tensor_core_share": ps.tensor_core_share, "basis_note": ps.basis_note,
        "padding_hint": padding_hint(ps.odd_gemms, ps.step_ms),
        "time_basis": ps.time_basis, "profiled_step": to_dict(ps),
        "trace_steps": step.count if step else 1, "step_analysed": step.name if step else None,
    }, indent=2)


def _text(path: Path, ps, step) -> str:
    from engine.measure.kernels import format_profiled

    trial = type("TraceTrial", (), {"precision": "trace",
                                    "profiled_step": ps, "status": "ok",
                                    "profiled_step_reason": None})()
    lines = [f"{path}: " + (f"shares of the measured step, {ps.measured_step_ms:.2f} ms"
                            if ps.measured_step_ms else
                            "shares of the profiled step (give --step-ms for the real one)")
             + (f"; {step.said()}" if step else ""),
             format_profiled([trial]).replace(
                 "Time in one extra profiled step per precision (never a measured step)",
                 "Time by category")]
    if ps.kernels:
        lines.append(f"Kernels, most time first (top {TOP_KERNELS} of {len(ps.kernels)})")
        for k in ps.kernels[:TOP_KERNELS]:
            share = f"{100 * k.ms / ps.step_ms:5.1f}%" if ps.step_ms else "  n/a"
            lines.append(f"  {k.ms:8.3f} ms {share}  {k.calls:>4}x  {k.op:<28.28} {k.name[:90]}")
    return "\n".join(lines)


def run(args) -> int:
    if args.step_ms is not None and not (math.isfinite(args.step_ms) and args.step_ms > 0):
        raise ValueError(f"--step-ms {args.step_ms} is not a step time: give the measured "
                         "step in milliseconds, e.g. --step-ms 24.84")
    path = Path(args.file)
    ps, kind, step = analyse_file(path, args.step_ms)
    print(_json(path, ps, kind, step) if args.json else _text(path, ps, step))
    return 0
