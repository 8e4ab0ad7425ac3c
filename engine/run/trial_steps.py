"""A trial's timed steps: one optimiser step (named ranges for the profiled step), the warm-up
and measured steps, each read back while the next one runs, the energy window (NVML, AMD SMI)
over the measured ones, and what torch.compile did for them."""

from __future__ import annotations

import time
from collections import deque

import torch
from torch.profiler import record_function

from engine.core.config import RunConfig, warmup_steps
from engine.core.events import StepSample
from engine.core.recipes import Recipe, autocast_for
from engine.measure import nvml
from engine.measure.device import DeviceInfo
from engine.measure.gpm import GpmWindow
from engine.measure.grad_norm import fp32_norm
from engine.measure.kernels import GRAD_NORM_RANGE, SCALER_RANGE
from engine.measure.peaks import mfu as mfu_of
from engine.measure.trackers import ScalarReadback, StepTimer
from engine.run.trial_state import TrialState


def step(config: RunConfig, rec: Recipe, device: torch.device, model, params, optimizer,
          scaler, batches, i: int):
    """One optimiser step; the named ranges let the profiled step attribute its time."""
    loss_sum = torch.zeros((), device=device)
    for micro in range(config.grad_accum):
        batch = batches[(i * config.grad_accum + micro) % len(batches)]
        with autocast_for(rec, device):
            loss = model(**batch).loss / config.grad_accum
        (scaler.scale(loss) if scaler else loss).backward()
        loss_sum += loss.detach().float()
    scale_before = scale_after = None
    if scaler:
        with record_function(SCALER_RANGE):
            scaler.unscale_(optimizer)
        # the scale as a device tensor: read after the step, so no extra host sync now
        scale_before = scaler._get_scale_async().clone()
    with record_function(GRAD_NORM_RANGE):
        # the norm only: clip_grad_norm_ would also rewrite every gradient
        grad_norm = fp32_norm([p.grad for p in params if p.grad is not None], device)
    if scaler:
        with record_function(SCALER_RANGE):
            scaler.step(optimizer)
            scaler.update()
        scale_after = scaler._get_scale_async().clone()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm, scale_before, scale_after


def train_steps(state: TrialState, model, params, optimizer, scaler, batches, alloc, emit,
                 cancelled, gpm: GpmWindow, count_first=None) -> bool:
    """Warm-up and measured steps; each step is read back while the next one runs.
    ``count_first`` runs the first (warm-up) step, counting its FLOPs."""
    config, rec = state.config, state.rec
    device = state.device_info.torch_device
    timer = StepTimer(device)
    readback = ScalarReadback(device, width=4)  # loss, grad norm, scale before, scale after
    energy = _EnergyWindow(state)
    pending: deque = deque()
    warmup = warmup_steps(config.warmup)  # never a first step in a median
    try:
        for i in range(warmup + config.steps):
            if cancelled():
                return True
            if i == 0:
                state.phase(emit, "warm-up")
            if i == warmup:  # GPM's and the energy counter's window: measured steps
                _drain(state.device_info)  # the warm-up's queued kernels stay outside it
                state.phase(emit, "measuring")
                gpm.start()
                energy.begin()

            def this_step(i=i):
                return step(config, rec, device, model, params, optimizer, scaler, batches, i)

            counted = i == 0 and count_first is not None
            alloc.start()
            timer.start()
            loss_sum, grad_norm, scale_before, scale_after = (count_first(this_step) if counted
                                                              else this_step())
            mark = timer.stop()
            scalars = readback.push([loss_sum, grad_norm, scale_before, scale_after])
            allocated, reserved = alloc.sample(measured=i >= warmup)
            pending.append((i, i < warmup, mark, scalars, allocated, reserved))
            energy.count(i >= warmup)
            while len(pending) > 1:
                _emit_step(state, emit, timer, readback, pending.popleft())
        _drain(state.device_info)  # the last measured step's kernels stay inside the window
        energy.end()
    finally:  # steps that completed before a failure or a cancel are kept
        while pending:
            _emit_step(state, emit, timer, readback, pending.popleft())
    return False


def _drain(info: DeviceInfo) -> None:
    """Wait for the GPU's queued work: a window read from NVML (GPM, energy) begins and
    ends on an idle GPU, so it covers exactly the measured steps' kernels."""
    if info.kind == "cuda":
        torch.cuda.synchronize(info.torch_device)


class _EnergyWindow:
    """Energy of the measured steps from NVML's total-energy counter (GPU only).

    ``train_steps`` drains the GPU before ``begin`` and ``end``, so the counter's delta
    covers exactly the measured steps' work. The counter is device-wide: another process
    on the GPU adds to it.
    """

    def __init__(self, state: TrialState):
        self.state = state
        info = state.device_info
        self.cuda = info.kind == "cuda"
        # NVML on NVIDIA; on ROCm AMD SMI's energy accumulator (engine.measure.amd_smi)
        self.smi, self.handle = info.telemetry()
        self.start_j = self.start_s = None
        self.steps = 0
        if not self.cuda:
            state.energy = (None, 0, "no energy counter on the CPU")
        elif self.handle is None:
            state.energy = (None, 0, f"{self._lib} does not see this GPU: "
                                     f"{self.smi.unavailable_reason()}")

    @property
    def _lib(self) -> str:
        return "NVML" if self.smi is nvml else "AMD SMI"

    def begin(self) -> None:
        if self.handle is None:
            return
        self.start_j, self.start_s = self.smi.energy_j(self.handle), time.perf_counter()
        if self.start_j is None:
            needs = ("nvmlDeviceGetTotalEnergyConsumption needs Volta+" if self.smi is nvml
                     else "amdsmi_get_energy_count is not supported on a virtual machine guest")
            self.state.energy = (None, 0, f"this GPU or driver has no {self._lib} energy "
                                          f"counter ({needs})")

    def count(self, measured: bool) -> None:
        self.steps += measured

    def end(self) -> None:
        if self.start_j is None or not self.steps:
            return
        end_j, seconds = self.smi.energy_j(self.handle), time.perf_counter() - self.start_s
        if end_j is None or end_j <= self.start_j:
            self.state.energy = (None, 0, f"the {self._lib} energy counter did not advance over "
                                          f"the {seconds:.3g} s of measured steps: run more steps")
            return
        this_round = f" of round {self.state.round_index + 1}" if self.state.round_index else ""
        self.state.energy = (end_j - self.start_j, self.steps, (
            f"{self._lib} total-energy counter delta over the {self.steps} measured "
            f"steps{this_round} ({seconds:.3g} s, GPU drained at both ends), divided by steps "
            "and by tokens; device-wide: another process on this GPU would add to it"))


def _emit_step(state: TrialState, emit, timer: StepTimer, readback: ScalarReadback, item) -> None:
    i, warm, mark, scalars, allocated, reserved = item
    config = state.config
    step_ms = timer.sample(mark)
    loss, norm, before, after = readback.read(scalars)
    model = state.flops.analytic_per_step if state.flops else None
    counted = state.flops.counted_per_step if state.flops else None
    tflops = model / (step_ms / 1e3) / 1e12 if model and step_ms > 0 else None
    mfu = mfu_of(tflops * 1e12, state.peak) if tflops is not None else None
    mfu_measured = (mfu_of(tflops * 1e12, state.measured_peak)
                    if tflops is not None and state.measured_peak else None)
    hfu = mfu_of(counted / (step_ms / 1e3), state.peak) if counted and step_ms > 0 else None
    skipped = after is not None and after < before
    norm = None if skipped else norm  # a skipped step's norm is inf/NaN
    sample = StepSample(
        precision=state.rec.precision,
        step=state.step_offset + i,
        warmup=warm,
        loss=loss,
        step_ms=step_ms,
        tokens_per_s=config.tokens_per_step / (step_ms / 1e3) if step_ms > 0 else 0.0,
        tflops=tflops,
        mfu=mfu,
        allocated_bytes=allocated,
        reserved_bytes=reserved,
        loss_scale=after,
        skipped=skipped,
        grad_norm=norm,
        time_s=time.time(),
        round=state.round_index,
        hfu=hfu,
        mfu_measured=mfu_measured,
    )
    state.steps.append(sample)
    emit(sample)


def compile_counts() -> tuple[int, dict]:
    """torch._dynamo's running totals: graphs compiled, and graph breaks by reason."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"], dict(counters["graph_break"])


def compile_note(before: tuple[int, dict], after: tuple[int, dict]) -> tuple[str, int]:
    """What torch.compile did for this trial's steps: a graph break leaves the code around
    it to run eagerly, which the step times would otherwise hide."""
    graphs = after[0] - before[0]
    # dynamo notes a break each time it traces past it (again after a restart), so the
    # distinct reasons are counted, not the notes
    breaks = [reason for reason, n in after[1].items() if n > before[1].get(reason, 0)]
    count = len(breaks)
    text = (f"torch.compile: {graphs} graph{'s' if graphs != 1 else ''} compiled, "
            f"graph breaks for {count} reason{'s' if count != 1 else ''}")
    if breaks:
        first = breaks[0].strip().splitlines()[0]
        text += f" (the code between graphs ran eagerly; first: {first})"
    return text, count
