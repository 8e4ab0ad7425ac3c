"""Trace what differs, scale what repeats: the plan of a deep model from a few layers.

Every figure a traced step gives (the peak and its categories, what each phase began
with, FLOPs by dtype, bytes moved) is a sum over the model's parts, and each repeat of the
layer pattern (engine.run.plan_layers) adds the same parts. So the step of the model cut
to 1, 2 and 3 repeats is traced, each figure's growth per repeat is read from the first
two, and the third checks it: where every figure grows by the same amount per repeat
(within what would move the full model's figure by 0.1%) and the peak falls in the same
phase, the figures are extended to the full count of repeats; otherwise the cut is tried
at 2, 3 and 4 repeats, and then the model is traced whole. ``full_trace`` traces it whole
from the start. The memory timeline is extended change by change the same way
(engine.run.plan_scale_timeline); where it does not extend alike, neither does the plan.

Mixture-of-experts layers: torch's grouped matmul has no fake kernel for float32 inputs,
so the trace routes transformers' experts through its own grouped-matmul fallback op (one
matmul per expert, with a fake kernel); the bytes saved for backward are the same inputs
and weights.
"""

from __future__ import annotations

import dataclasses
import tempfile
from contextlib import contextmanager, nullcontext

SAMPLES = ((1, 2, 3), (2, 3, 4))
# a figure's growth per repeat may differ between the samples by at most this share of the
# full model's figure (after extending it to every repeat)
TOLERANCE = 1e-3


@contextmanager
def experts_traceable():
    """transformers' MoE experts through its fallback op while tracing (see above)."""
    try:
        from transformers.integrations import moe
    except ImportError:  # no MoE support in this transformers: nothing to route
        yield
        return
    real = moe._can_use_grouped_mm
    moe._can_use_grouped_mm = lambda *args, **kwargs: False
    try:
        yield
    finally:
        moe._can_use_grouped_mm = real


def _figures(step) -> dict:
    """Every number of a TracedStep, by a flat key."""
    m = step.memory
    flat = {("peak",): m.peak_bytes, ("start",): m.start_bytes,
            ("moved",): step.bytes_moved, ("fused",): step.bytes_moved_fused}
    flat |= {("at_peak", k): v for k, v in m.at_peak.items()}
    flat |= {("phase_start", p, k): v for p, cats in m.at_phase_start.items()
             for k, v in cats.items()}
    flat |= {("flops", k): v for k, v in step.flops_by_peak_dtype.items()}
    return flat


def extend(samples: list, points: tuple, repeats: int, pattern=None):
    """The TracedStep of ``repeats`` repeats from steps traced at ``points`` repeats, or
    (None, why) where a figure does not grow alike per repeat; its timeline scaled from the
    cut steps' unthinned ones where ``pattern`` is given, else None."""
    from engine.run.plan_scale_timeline import scale_timeline

    a, b, c = (_figures(s) for s in samples)
    phases = {s.memory.phase for s in samples}
    if len(phases) > 1:
        return None, f"the peak falls in {', '.join(sorted(phases))} at different cuts"
    out = {}
    n1, n2, n3 = points
    for key in a.keys() | b.keys() | c.keys():
        q1, q2, q3 = (f.get(key, 0) or 0 for f in (a, b, c))
        step1, step2 = (q2 - q1) / (n2 - n1), (q3 - q2) / (n3 - n2)
        value = q3 + (repeats - n3) * step2
        if abs(step2 - step1) * (repeats - n3) > TOLERANCE * max(abs(value), 1):
            return None, f"{' '.join(map(str, key))} does not grow alike per repeat"
        out[key] = value if key[0] == "flops" else round(value)
    last, timeline = samples[-1], None
    if pattern is not None:
        timeline, why = scale_timeline([s.memory.timeline for s in samples], points, repeats,
                                       pattern.prefix, pattern.period)
        if timeline is None:
            return None, f"the memory timeline: {why}"
    memory = dataclasses.replace(
        last.memory, timeline=timeline, peak_bytes=out[("peak",)], start_bytes=out[("start",)],
        at_peak={k: out[("at_peak", k)] for k in last.memory.at_peak},
        at_phase_start={p: {k: out[("phase_start", p, k)] for k in cats}
                        for p, cats in last.memory.at_phase_start.items()})
    return type(last)(memory, {k: out[("flops", k)] for k in last.flops_by_peak_dtype},
                      out[("moved",)], out[("fused",)]), ""


def _cut_trace(trace, config, precision: str, batch: int, model_config, pattern,
               repeats: int):
    from engine.run.plan_layers import cut_config

    with tempfile.TemporaryDirectory(prefix="ampscope-cut-") as folder:
        cut_config(model_config, pattern, repeats).save_pretrained(folder)
        return trace(dataclasses.replace(config, model=folder), precision, batch)


def scaling_pattern(config):
    """(LayerPattern or None, the model's config, why it is traced whole) for a
    PlanConfig's model."""
    from engine.models.load import load_config, resolve_source
    from engine.run.plan_layers import find_pattern

    if config.full_trace:
        return None, None, "--full-trace"
    source = resolve_source(config.model)
    if source.kind == "hub":
        return None, None, "a hub model's code may read more than its config"
    model_config, _ = load_config(source)
    pattern, why = find_pattern(model_config, SAMPLES[-1][-1])
    return pattern, model_config, why


def trace_any(config, precision: str, batch: int, trace, log=lambda msg: None,
              timeline: bool = True):
    """(TracedStep, how it was made): scaled from cut models where the layers repeat
    alike, else one trace of the whole model. ``trace(config, precision, batch)`` traces one
    step (engine.run.plan_trace's, passed in by engine.run.plan); ``timeline`` False: a
    scaled step has no timeline (a batch probe needs only the peak)."""
    from engine.measure.memory_timeline import unthinned

    with experts_traceable():
        pattern, model_config, why = scaling_pattern(config)
        for points in SAMPLES if pattern else ():
            if points[-1] >= pattern.repeats:
                break
            steps = []
            for n in points:
                log(f"{precision}: tracing {pattern.cut_layers(n)} of {pattern.layers} "
                    f"layers at batch {batch}")
                with unthinned() if timeline else nullcontext():
                    steps.append(_cut_trace(trace, config, precision, batch, model_config,
                                            pattern, n))
            scaled, why = extend(steps, points, pattern.repeats, pattern if timeline else None)
            if scaled is not None:
                cuts = ", ".join(str(pattern.cut_layers(n)) for n in points)
                return scaled, (
                    f"scaled: traced the model cut to {cuts} of its {pattern.layers} layers "
                    f"({pattern.describe()}); every figure grows alike per repeat (checked "
                    "at the third cut) and is extended to the full count, the memory "
                    "timeline change by change")
        log(f"{precision}: tracing the whole model at batch {batch}")
        return trace(config, precision, batch), f"traced whole: {why}"
