"""A trial's summary from its steps: one builder for a profile trial, a user's run
(ampscope.Recorder) and a trial read back cut short from its journal, so the same steps
are summarised by the same code wherever they were recorded.

Medians over the measured (non-warm-up) steps: one slow step (a checkpoint save, an
evaluation) does not move them. A step the GradScaler skipped skips the optimiser, so it
is faster: it is left out of the step time and counted among the measured steps' skipped.
"""

from __future__ import annotations

import statistics

from engine.core.events import MemoryBreakdown, StepSample, TrialSummary
from engine.measure.peaks import PeakLookup
from engine.measure.peaks import mfu as mfu_of
from engine.record.spread import step_spread

ALL_SKIPPED = ("every measured step was skipped by the GradScaler (inf/NaN gradients), so "
               "there is no step time")
NO_STEPS = "no steps measured"


def summarise(steps: list[StepSample], *, tokens_per_step: int | None,
              model_flops_per_step: int | None, counted_flops_per_step: int | None,
              peak: PeakLookup | None, measured_peak: PeakLookup | None = None,
              memory: MemoryBreakdown | None = None, memory_reason: str = "not measured",
              energy: tuple[float | None, int, str] | None = None,
              distinct_batches: int | None = None, no_steps_reason: str = NO_STEPS,
              no_flops_reason: str = NO_STEPS,
              no_measured_peak_reason: str | None = None,
              common_peak: PeakLookup | None = None) -> TrialSummary:
    """``tokens_per_step``/``model_flops_per_step``: the same for every step (a profile
    trial's), or None where they vary from step to step (a user's loop): tokens/s and
    TFLOP/s are then the medians of the steps' own. ``energy``: (joules, steps, how).
    The reasons say why a figure is n/a: no measured step, no model FLOPs, no measured
    matmul peak (where none was looked up)."""
    measured = [s for s in steps if not s.warmup]
    timed = [s for s in measured if not s.skipped]
    median_ms = statistics.median(s.step_ms for s in timed) if timed else None

    def per_second(per_step, scale, field):
        if per_step is not None:
            return per_step / (median_ms / 1e3) / scale if per_step and median_ms else None
        values = [getattr(s, field) for s in timed]  # each step's own, where they vary
        return statistics.median(values) if values and None not in values else None

    tps = per_second(tokens_per_step, 1, "tokens_per_s")
    tflops = per_second(model_flops_per_step, 1e12, "tflops")
    hw_tflops = (counted_flops_per_step / (median_ms / 1e3) / 1e12
                 if counted_flops_per_step and median_ms else None)
    mfu = mfu_of(tflops * 1e12, peak) if tflops is not None and peak else None
    hfu = mfu_of(hw_tflops * 1e12, peak) if hw_tflops is not None and peak else None
    mfu_measured = (mfu_of(tflops * 1e12, measured_peak)
                    if tflops is not None and measured_peak else None)
    if measured and not timed:
        mfu_reason = ALL_SKIPPED
    elif peak is None:
        mfu_reason = no_steps_reason
    elif peak.flops_per_s is None:
        mfu_reason = peak.reason
    else:
        mfu_reason = None if mfu is not None else (no_flops_reason if measured
                                                   else no_steps_reason)
    if mfu_measured is not None:
        measured_reason = None
    elif measured_peak is not None and measured_peak.flops_per_s is None:
        measured_reason = measured_peak.reason
    elif measured_peak is None and no_measured_peak_reason is not None:
        measured_reason = no_measured_peak_reason
    else:  # no step time (the same reason as the datasheet MFU's) or no model FLOPs
        measured_reason = mfu_reason if measured and not timed else no_flops_reason
    mfu_common = mfu_of(tflops * 1e12, common_peak) if tflops is not None and common_peak \
        else None
    if mfu_common is not None or common_peak is None:
        common_reason = None if mfu_common is not None else "not looked up for this trial"
    elif common_peak.flops_per_s is None:
        common_reason = common_peak.reason
    else:
        common_reason = mfu_reason if measured and not timed else no_flops_reason
    joules, energy_steps, energy_method = energy or (None, 0, "")
    per_step = joules / energy_steps if joules is not None and energy_steps else None
    last = steps[-1] if steps else None
    return TrialSummary(
        steps_measured=len(measured),
        median_step_ms=median_ms,
        tokens_per_s=tps,
        tflops=tflops,
        mfu=mfu,
        mfu_reason=mfu_reason,
        peak_flops=peak.flops_per_s if peak else None,
        peak_flops_source=peak.source if peak else None,
        peak_memory_bytes=memory.total_bytes if memory else None,
        peak_memory_method=memory.total_method if memory else memory_reason,
        skipped_steps=sum(1 for s in measured if s.skipped),
        final_loss=last.loss if last else None,
        final_loss_scale=last.loss_scale if last else None,
        energy_per_step_j=per_step,
        energy_per_token_j=(per_step / tokens_per_step
                            if per_step is not None and tokens_per_step else None),
        energy_method=energy_method,
        # its tokens/s interval assumes one token count per step
        spread=step_spread(steps, tokens_per_step) if tokens_per_step else None,
        distinct_batches=distinct_batches,
        hardware_tflops=hw_tflops,
        hfu=hfu,
        mfu_measured=mfu_measured,
        mfu_measured_reason=measured_reason,
        measured_peak_flops=measured_peak.flops_per_s if measured_peak else None,
        measured_peak_source=measured_peak.source if measured_peak else None,
        mfu_common=mfu_common,
        mfu_common_reason=common_reason,
        common_peak_flops=common_peak.flops_per_s if common_peak else None,
        common_peak_source=common_peak.source if common_peak else None,
    )
