"""The FLOPs a trial's step does and the peaks its steps are divided by: counted in its first
warm-up step (an eager trial) or in an uncounted probe step before the steps (a trial that
compiles), and the measured matmul peak measured again when a step beats it."""

from __future__ import annotations

import dataclasses

from engine.core.events import FlopsInfo, StepSample
from engine.core.recipes import autocast_for
from engine.measure import flops as flops_mod
from engine.measure import matmul_peak, peak_choice
from engine.measure.peaks import mfu as mfu_of
from engine.measure.peaks import over_peak
from engine.measure.untouched import untouched
from engine.models.load import dims
from engine.run.step_undo import StepUndo
from engine.run.trial_state import TrialState, eager_oom_of_compiled, failure, release


def probe(state: TrialState, loaded, batch: dict) -> None:
    """One uncounted forward+backward under FlopCounterMode, before the steps of a trial
    that compiles (the model, or torchao's optimizer step): hardware and model FLOPs."""
    config, rec, model = state.config, state.rec, loaded.model
    device = state.device_info.torch_device

    def step():
        with autocast_for(rec, device):
            loss = model(**batch).loss
        loss.backward()

    try:
        with untouched(model, device):
            counted = flops_mod.count_flops(step, tf32=rec.tf32 and device.type == "cuda")
        counted_method = ("torch.utils.flop_counter.FlopCounterMode over one forward+backward, "
                          f"x {config.grad_accum} micro-batches")
    except Exception as exc:  # some quantised kernels refuse the counting mode
        model.zero_grad(set_to_none=True)
        counted = None
        if eager_oom_of_compiled(state, exc):
            release(device)
            counted_method = (f"n/a: the eager counting step ran out of memory "
                              f"({failure(exc)[1]}); the compiled steps hold less, so the "
                              "trial went on without hardware FLOPs")
        else:
            with untouched(model, device):
                step()
            counted_method = f"FlopCounterMode failed: {type(exc).__name__}: {exc}"
    model.zero_grad(set_to_none=True)
    _set_flops(state, loaded, counted, config.grad_accum, counted_method)


def counted_step(state: TrialState, loaded, rates, step, optimizer, scaler):
    """The first warm-up step under FlopCounterMode (an eager trial's FLOPs cost no step of
    their own), then its FLOPs and the peaks its steps are divided by. Returns the step's
    outputs."""
    rec, device = state.rec, state.device_info.torch_device
    outputs = []
    undo = StepUndo(optimizer, scaler, device)
    try:
        counted = flops_mod.count_flops(lambda: outputs.append(step()),
                                        tf32=rec.tf32 and device.type == "cuda")
        counted_method = ("torch.utils.flop_counter.FlopCounterMode over the first warm-up "
                          f"step: forward and backward of its {state.config.grad_accum} "
                          "micro-batch(es) and the optimizer's step")
    except Exception as exc:  # some quantised kernels refuse the counting mode
        undo.restore()  # the attempt may have stopped anywhere: the rerun is a clean step
        if undo.began_update:  # weights may be half updated: a rerun would step on top
            raise
        counted, outputs = None, [step()]
        counted_method = f"FlopCounterMode failed: {type(exc).__name__}: {exc}"
    finally:
        undo.close()
    _set_flops(state, loaded, counted, 1, counted_method)
    set_peaks(state, rates)
    return outputs[0]


def _set_flops(state: TrialState, loaded, counted, accum: int, counted_method: str) -> None:
    """``state.flops``: ``counted`` (x ``accum`` where it covered one micro-batch) beside
    the analytic model FLOPs."""
    config = state.config
    mm_total, mm_trainable = flops_mod.matmul_param_counts(loaded.model)
    analytic, formula = flops_mod.model_flops(
        tokens=config.tokens_per_step, matmul_params=mm_total,
        trainable_matmul_params=mm_trainable,
        attention=flops_mod.attention_stacks(dims(loaded.config), config.seq_len),
    )
    state.flops = FlopsInfo(
        counted_per_step=counted.total * accum if counted else None,
        counted_method=counted_method,
        analytic_per_step=analytic,
        analytic_formula=formula,
        by_op={k: v * accum for k, v in counted.by_op.items()} if counted else {},
        by_peak_dtype={k: v * accum for k, v in counted.by_peak_dtype.items()} if counted else {},
        model_convention=flops_mod.MODEL_FLOPS_CONVENTION,
        hardware_convention=flops_mod.HARDWARE_FLOPS_CONVENTION,
    )


def set_peaks(state: TrialState, rates) -> None:
    """The datasheet and measured peaks for the dtypes this trial's FLOPs ran in."""
    by_dtype = state.flops.by_peak_dtype
    state.peak = peak_choice.datasheet_peak(state.device_info, state.rec, by_dtype)
    state.measured_peak = peak_choice.measured_peak(rates, state.rec, by_dtype)


def remeasure_peak(state: TrialState, log) -> None:
    """A step beat the cached matmul peak, so it was measured low (under load): measure again,
    keep the best, and recompute this trial's MFU against it; a figure still above 100% is
    n/a (engine.measure.peaks.over_peak)."""
    best = max(s.mfu_measured for s in state.steps[state.step_offset:] if s.mfu_measured)
    why = f"a {state.rec.precision} step reached {best:.0%} of it"
    log(f"this run beat the measured matmul peak ({why}): measuring it again", "warning")
    rates = matmul_peak.remeasure(state.device_info, why)
    state.measured_peak = peak_choice.measured_peak(rates, state.rec, state.flops.by_peak_dtype)

    def again(s: StepSample) -> StepSample:
        mfu = mfu_of(s.tflops * 1e12, state.measured_peak) if s.tflops is not None else None
        return dataclasses.replace(s, mfu_measured=None if over_peak(mfu) else mfu)

    state.steps[state.step_offset:] = [again(s) for s in state.steps[state.step_offset:]]
