"""What a trial has measured so far (``TrialState``), the TrialResult it becomes whatever the
ending, and how the exception that ended a trial reads as its status."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from engine.core.config import RunConfig
from engine.core.events import (
    FlopsInfo,
    GpmMetrics,
    HeldOutLoss,
    LostUpdates,
    MemoryBreakdown,
    ModuleInfo,
    ParamInfo,
    PhaseChanged,
    PredictedMemory,
    ProfiledStep,
    QuantError,
    StepSample,
    TrialResult,
    TrialSummary,
)
from engine.core.recipes import Recipe, run_description
from engine.measure.device import DeviceInfo
from engine.measure.peaks import PeakLookup
from engine.record.summary import summarise
from engine.run.timed_memory import timed_peak


@dataclass
class TrialState:
    """What a trial has measured so far."""

    config: RunConfig
    rec: Recipe
    device_info: DeviceInfo
    started_s: float = field(default_factory=time.time)
    param_count: int = 0
    trainable_params: int = 0
    footprint_bytes: int | None = None
    footprint_note: str = ""
    dtype_map: list[ParamInfo] = field(default_factory=list)
    module_tree: list[ModuleInfo] = field(default_factory=list)
    memory: MemoryBreakdown | None = None
    memory_at_rest: bool = False  # ``memory`` is what a stopped trial held, not a peak
    predicted: PredictedMemory | None = None
    flops: FlopsInfo | None = None
    steps: list[StepSample] = field(default_factory=list)
    peak: object = None  # the datasheet peak (PeakLookup)
    measured_peak: PeakLookup | None = None  # this machine's measured matmul peak
    common_peak: PeakLookup | None = None  # one denominator for every recipe on the device
    profiled: ProfiledStep | None = None
    profiled_reason: str | None = None
    gpm: GpmMetrics | None = None
    compiled: bool | None = None  # None until the trial decided (it may never run)
    notes: list[str] = field(default_factory=list)
    nvml_baseline_bytes: int | None = None  # device-wide used memory before the trial
    energy: tuple[float | None, int, str] = (None, 0, "not measured")  # joules, steps, how
    round_index: int = 0  # interleaved rounds: steps of earlier rounds come first in ``steps``
    step_offset: int = 0
    distinct_batches: int | None = None
    lora: dict | None = None
    quant_error: QuantError | None = None
    quant_error_reason: str | None = "not measured: the trial ended before its first step"
    heldout_before: float | None = None
    profiled_steps_run: int = 0  # optimiser steps the profiled step took
    heldout: HeldOutLoss | None = None
    heldout_reason: str = "not measured: the trial ended before its untimed tail"
    lost_updates: LostUpdates | None = None
    lost_updates_reason: str = "not measured: the trial ended before its untimed tail"

    memory_timeline: object = None  # the memory step's MemoryTimeline
    fp8_auto: dict | None = None  # an ":auto" recipe's layers (engine/run/fp8_auto.py)

    def phase(self, emit, phase: str) -> None:
        emit(PhaseChanged(self.rec.precision, phase, time.time(), self.round_index))

    @property
    def optimizer(self) -> str:
        """This trial's optimiser: its label's "+optim", else the run's --optimizer."""
        return self.rec.optimizer or self.config.optimizer

    def result(self, status: str, reason: str | None,
               traceback: str | None = None) -> TrialResult:
        verdict = self.device_info.verdict(self.rec.precision)
        return TrialResult(
            precision=self.rec.precision,
            status=status,
            reason=reason,
            recipe=run_description(self.rec, self.device_info.kind, self.optimizer,
                                   self.compiled),
            notes=list(self.notes),
            device=self.device_info.describe(),
            param_count=self.param_count,
            trainable_params=self.trainable_params,
            load_footprint_bytes=self.footprint_bytes,
            footprint_note=self.footprint_note,
            memory=self.memory,
            predicted_memory=self.predicted,
            dtype_map=self.dtype_map,
            module_tree=self.module_tree,
            flops=self.flops,
            steps=list(self.steps),
            summary=None if status == "unsupported" else self._summary(),
            lora=self.lora,
            started_s=self.started_s,
            finished_s=time.time(),
            profiled_step=self.profiled,
            gpm=self.gpm,
            profiled_step_reason=None if self.profiled else (
                self.profiled_reason or "the trial ended before its measured steps finished"),
            support=verdict.support if verdict else None,
            support_reason=verdict.reason if verdict else None,
            quant_error=self.quant_error,
            quant_error_reason=None if self.quant_error else self.quant_error_reason,
            compiled=self.compiled,
            lost_updates=self.lost_updates,
            lost_updates_reason=None if self.lost_updates else self.lost_updates_reason,
            heldout_loss=self.heldout,
            heldout_loss_reason=None if self.heldout else self.heldout_reason,

            memory_timeline=self.memory_timeline,
            traceback=traceback,
            fp8_auto=self.fp8_auto,
        )

    def _summary(self) -> TrialSummary:
        flops = self.flops
        timed = timed_peak(self.memory, self.compiled)  # the compiled steps' peak, not eager's
        return summarise(
            self.steps, tokens_per_step=self.config.tokens_per_step,
            model_flops_per_step=flops.analytic_per_step if flops else None,
            counted_flops_per_step=flops.counted_per_step if flops else None,
            peak=self.peak, measured_peak=self.measured_peak, common_peak=self.common_peak,
            # bytes held at rest by a stopped trial are kept in ``memory``, never as its peak
            memory=None if self.memory_at_rest else timed[0],
            memory_reason=("not measured: the run was stopped before the watched step"
                           if self.memory_at_rest else timed[1] or "not measured"),
            energy=self.energy, distinct_batches=self.distinct_batches)


HOST_OOM_ADVICE = ("try a smaller batch, sequence or model, or raise the memory limit "
                   "(ulimit -v, the container's memory limit)")


def failure(exc: Exception) -> tuple[str, str]:
    """A trial's status and reason for the exception that ended it."""
    text = str(exc)
    first = text.splitlines()[0] if text else type(exc).__name__
    if isinstance(exc, torch.OutOfMemoryError) or "CUBLAS_STATUS_ALLOC_FAILED" in text:
        return "oom", f"out of GPU memory: {first}"
    if isinstance(exc, MemoryError) or "can't allocate memory" in text:
        return "oom", f"out of host memory ({first}): {HOST_OOM_ADVICE}"
    return "error", f"{type(exc).__name__}: {text}"


def eager_oom_of_compiled(state: TrialState, exc: Exception) -> bool:
    """An OOM in one of the eager steps (FLOP counting, memory watching) of a compiled
    trial: eager kernels keep intermediates that compiled ones fuse away, so it says
    nothing about whether the compiled steps fit (fit's probes must not read it so)."""
    return bool(state.compiled) and failure(exc)[0] == "oom"


def release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
