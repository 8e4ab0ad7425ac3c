"""One trace per distinct step within a plan.

The answer plans each lever once per card (a change judged on the card it was planned on,
engine.run.plan_answer), but the traced step does not depend on the card: two cards that
both need 8-bit AdamW traced it twice, a deep model three cut models each time. The memo
keys a trace by every PlanConfig field that shapes the step, so only the judging differs.
"""

from __future__ import annotations

import dataclasses

# PlanConfig fields that judge or annotate a traced step and never change it
JUDGING = frozenset({"cards", "context_bytes", "max_batch", "measured", "history", "levers"})


class TraceMemo:
    """engine.run.plan_scale.trace_any, each (config, recipe, micro-batch) traced once."""

    def __init__(self) -> None:
        self._traced: dict = {}

    def trace(self, config, precision: str, batch: int, log, timeline: bool = True):
        from engine.run.plan_scale import trace_any
        from engine.run.plan_trace import trace_step

        key = (precision, batch, timeline, *((f.name, getattr(config, f.name))
                                             for f in dataclasses.fields(config)
                                             if f.name not in JUDGING))
        if key not in self._traced:
            self._traced[key] = trace_any(config, precision, batch, trace_step, log,
                                          timeline=timeline)
        return self._traced[key]
