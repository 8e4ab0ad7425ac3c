"""One step of a Chrome trace that holds several.

torch.profiler's schedule with ``active`` > 1 (``tensorboard_trace_handler``) writes each
active step under a "ProfilerStep#N" range. Its kernel time weighed against one measured
step (``main.py trace --step-ms``) must be one step's, so the last step (the most warmed
up) is analysed alone: the CPU ops and launches inside its range, and the device work they
launched, which may run after the range ends.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.measure.trace_read import CPU_CATS, DEVICE_CATS, RUNTIME_CATS

STEP_PREFIX = "ProfilerStep#"


@dataclass(frozen=True)
class TraceStep:
    """The step analysed out of a trace of ``count`` profiled steps."""

    name: str  # its range, e.g. "ProfilerStep#3"
    count: int
    wall_us: float

    def said(self) -> str:
        return (f"one step: {self.name}, the last of the trace's {self.count} profiled "
                "steps")


def last_step(raw) -> tuple[object, TraceStep | None]:
    """``raw`` (a parsed trace) cut to its last "ProfilerStep#N" step, with that step; as it
    is, with None, when it holds fewer than two."""
    items = raw["traceEvents"] if isinstance(raw, dict) else raw
    ranges = sorted((e for e in items if e.get("ph") == "X" and "dur" in e
                     and e.get("cat") in CPU_CATS
                     and str(e.get("name", "")).startswith(STEP_PREFIX)),
                    key=lambda e: float(e["ts"]))
    if len(ranges) < 2:
        return raw, None
    last = ranges[-1]
    lo, hi = float(last["ts"]), float(last["ts"]) + float(last["dur"])

    def inside(e) -> bool:
        return lo <= float(e["ts"]) and float(e["ts"]) + float(e["dur"]) <= hi

    def correlation(e):
        return e.get("args", {}).get("correlation")

    timed = [e for e in items if e.get("ph") == "X" and "dur" in e]
    host = {id(e) for e in timed if e.get("cat") in CPU_CATS + RUNTIME_CATS and inside(e)}
    launches = {correlation(e) for e in timed if e.get("cat") in RUNTIME_CATS} - {None}
    launched = {correlation(e) for e in timed if id(e) in host and e.get("cat") in RUNTIME_CATS}

    def kept(e) -> bool:
        cat = e.get("cat")
        if e.get("ph") != "X" or "dur" not in e or cat not in CPU_CATS + RUNTIME_CATS \
                + DEVICE_CATS:
            return True  # metadata, flows, annotations: the analysis reads none of them
        if cat in DEVICE_CATS:  # by its launch; one with no launch in the trace, by time
            c = correlation(e)
            return c in launched if c in launches else lo <= float(e["ts"]) <= hi
        return id(e) in host

    cut = [e for e in items if kept(e)]
    step = TraceStep(last["name"], len(ranges), hi - lo)
    return ({**raw, "traceEvents": cut} if isinstance(raw, dict) else cut), step
