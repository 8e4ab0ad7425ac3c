"""A trial's untimed measurements: the SQNR forward, the memory step (memory by category, or
what a stopped trial held), the profiled step, the held-out loss and the lost updates.

The memory and profiled steps are optimiser steps as the timed ones are (the held-out loss
counts them); the others leave the model, optimiser, scaler and RNG as they found them. A
failure costs only its own figure, except in the memory step, which ends the trial unless
it is the eager step of a compiled trial running out of memory."""

from __future__ import annotations

import dataclasses
import os

import torch

from engine.core.config import TORCHAO_STEP, RunConfig, warmup_steps
from engine.core.events import MemoryBreakdown
from engine.core.recipes import Recipe, autocast_for
from engine.measure import memtrack, nvml, quant_error
from engine.measure.device import DeviceInfo
from engine.measure.kernel_workspace import with_kernel_workspace
from engine.measure.kernels import live_tensor_bytes, profile_step
from engine.measure.lost_updates import measure_trial as measure_lost_updates
from engine.measure.memory_breakdown import watched_memory
from engine.measure.step_basis import against_measured_steps
from engine.measure.trackers import AllocatorTracker
from engine.measure.untouched import untouched
from engine.models import heldout as held_out
from engine.models.load import dims
from engine.models.memory_model import predict_memory, with_errors
from engine.models.memory_model import shape_of as memory_shape
from engine.run import trial_steps
from engine.run.trial_state import TrialState, eager_oom_of_compiled, failure, release


def measure_quant_error(state: TrialState, model, batch: dict, device: torch.device) -> None:
    """Each matmul layer's SQNR on one uncounted forward; a failure costs only this figure."""
    reason = quant_error.reason_none(state.rec)
    if reason is None and not state.config.quant_error:
        reason = "turned off (--no-quant-error)"
    if reason is not None:
        state.quant_error_reason = reason
        return
    try:
        with untouched(model, device):
            state.quant_error = quant_error.measure(model, state.rec, batch, device)
    except Exception as exc:
        state.quant_error_reason = f"the SQNR forward failed: {type(exc).__name__}: {exc}"
    release(device)


def memory_step(state: TrialState, model, loaded, optimizer, scaler, batches,
                alloc: AllocatorTracker, emit, log) -> None:
    """The memory step after the measured ones, and the memory model's prediction beside it
    (``state.memory``, ``state.predicted``). A compiled trial whose eager memory step runs
    out of memory keeps what it holds at rest and the allocator's peak."""
    config, rec, info = state.config, state.rec, state.device_info
    device = info.torch_device
    state.phase(emit, "memory step")
    try:
        measured = tracked_step(config, rec, device, model, optimizer, scaler, batches)
    except Exception as exc:
        if not eager_oom_of_compiled(state, exc):
            raise
        optimizer.zero_grad(set_to_none=True)
        state.memory = _compiled_peak_only(model, optimizer, batches[0], alloc, device, exc)
        log(state.memory.notes, "warning")
    else:
        state.memory = memory_of_step(measured, alloc, info, state.compiled,
                                      state.nvml_baseline_bytes)
        state.memory_timeline = measured.timeline
        if rec.quant and info.kind != "cuda":
            state.notes.append(BNB_TEMPORARIES_NOTE)
        if state.optimizer in TORCHAO_STEP:
            state.notes.append(f"{state.optimizer}: the step that watches memory runs the "
                               "optimizer eagerly (torch.compile refuses to trace under the "
                               "memory watcher), so its scratch bytes are eager ones; the "
                               "optimizer state is the same")
    shape = memory_shape(model, getattr(model, "config", loaded.config), dims(loaded.config))
    predicted = predict_memory(rec, state.optimizer, shape, config.batch_size, config.seq_len,
                               config.grad_checkpointing, device.type)
    state.predicted = with_errors(predicted, state.memory)


def tracked_step(config: RunConfig, rec: Recipe, device: torch.device, model, optimizer, scaler,
                 batches) -> memtrack.MeasuredPeak:
    """One more optimiser step, untimed, watched by engine.measure.memtrack from a steady state
    (optimiser state exists, gradients were freed), as the timed steps ran it. engine.run.plan
    runs the same step on fake tensors."""
    watcher = memtrack.MemoryWatcher(device)
    watcher.track_training(model, optimizer, batches[0])
    # torchao's optimisers compile their step with fullgraph=True, which refuses to run
    # under a TorchDispatchMode: here it runs eagerly (the model is eager here already)
    with watcher, torch.compiler.set_stance("force_eager"):
        for micro in range(config.grad_accum):
            batch = batches[micro % len(batches)]
            watcher.phase = "forward"
            with autocast_for(rec, device):
                loss = model(**batch).loss / config.grad_accum
            watcher.phase = "backward"
            (scaler.scale(loss) if scaler else loss).backward()
            del loss
        watcher.phase = "optimizer"
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        watcher.mark_optimizer_state(optimizer)
        watcher.mark("zero_grad")
        optimizer.zero_grad(set_to_none=True)
    return watcher.result()


def memory_of_step(measured: memtrack.MeasuredPeak, alloc: AllocatorTracker, info: DeviceInfo,
            compiled: bool, nvml_baseline_bytes: int | None = None) -> MemoryBreakdown:
    method = ("engine.measure.memtrack: every storage from allocation to release over one step; "
              "the largest sum of live bytes")
    if compiled:
        method += " (an eager step: compiled kernels fuse and may allocate less)"
    allocator = alloc.stop()
    notes = ("categories are what was held at the peak; weight copies are autocast's cast "
             "(and bitsandbytes' dequantised) weights")
    if allocator[0] is None:  # the CPU, or no step ran before a cancel
        return watched_memory(measured, method, allocator, notes)
    # NVML and the allocator read at the same moment, the GPU idle: the gap is what the
    # allocator does not hold (CUDA context, loaded kernels), not a peak-vs-now artefact
    torch.cuda.synchronize(info.torch_device)
    reserved_now = alloc.reserved_now()
    nvml_bytes, nvml_method = nvml.process_memory(info.nvml_handle(), {os.getpid()},
                                                  nvml_baseline_bytes)
    return watched_memory(
        measured, method, allocator, notes,
        gpu_notes=". Context gap = NVML process memory - allocator reserved, both read after "
                  "the steps at the same moment",
        nvml_process_bytes=nvml_bytes,
        context_gap_bytes=nvml_bytes - reserved_now if nvml_bytes is not None else None,
        nvml_method=nvml_method,
        reserved_at_nvml_read_bytes=reserved_now,
    )


# the CPU peak is the dispatch-level tracker's: a buffer bitsandbytes allocates and frees
# inside one of its ops is never seen (the audit of #23 found GPT-NeoX int8 with gradient
# checkpointing 6.3% low, the other families under 1.5%); on CUDA the allocator's peak
# counts them
BNB_TEMPORARIES_NOTE = (
    "measured peak may be low: bitsandbytes' temporaries inside one op (dequantised weight "
    "tiles) are not seen by the tracker on this device; up to 6% was seen (GPT-NeoX int8 "
    "with gradient checkpointing), under 1.5% on other families")


def _compiled_peak_only(model, optimizer, batch, alloc: AllocatorTracker, device,
                        exc: Exception) -> MemoryBreakdown:
    """Memory of a compiled trial whose eager watched step ran out of memory: what is held
    at rest, and the allocator's peak over the compiled measured steps (GPU only)."""
    release(device)
    rest = memory_at_rest(model, optimizer, batch, device)
    peak_alloc, peak_res, covers = alloc.stop()
    why = (f"the eager step that watches memory by category ran out of memory "
           f"({failure(exc)[1]}); the compiled steps did not")
    if peak_alloc is None:
        return dataclasses.replace(rest, activations_method=f"not measured: {why}",
                                   notes=f"{why}: only what is held at rest was measured")
    return dataclasses.replace(
        rest, peak_allocated_bytes=peak_alloc, peak_reserved_bytes=peak_res,
        total_bytes=peak_alloc, total_method=f"torch.cuda.max_memory_allocated {covers}",
        activations_method=f"not measured: {why}",
        notes=f"{why}: the peak is the allocator's over the compiled steps; categories are "
              "what is held at rest")


def memory_at_rest(model, optimizer, batch, device) -> MemoryBreakdown:
    """What a stopped trial held between steps: exact bytes, but not a peak."""
    held = memtrack.MemoryWatcher(device).held_at_rest(model, optimizer, batch)
    return MemoryBreakdown(
        params_bytes=held["params"], buffers_bytes=held["buffers"],
        quant_state_bytes=held["quant_state"], grads_bytes=held["grads"],
        optimizer_bytes=held["optimizer"], inputs_bytes=held["inputs"],
        activations_bytes=None,
        activations_method="not measured: the run was stopped before the watched step",
        total_bytes=sum(held.values()),
        total_method="held at rest when the run was stopped (weights, optimiser state, "
                     "batch); no step was watched, so this is not the peak",
        notes="a stopped trial: its peak (activations, gradients in flight) was not measured")


def profiled_tail(state: TrialState, step_model, params, optimizer, scaler, batches, log,
                   cancelled, emit) -> None:
    if not state.config.profile_step:
        state.profiled_reason = "turned off (--no-kernel-profile)"
    elif not cancelled():
        state.phase(emit, "profiled step")
        _profiled_step(state, step_model, params, optimizer, scaler, batches, log)


def _profiled_step(state: TrialState, model, params, optimizer, scaler, batches, log) -> None:
    """One extra step under torch.profiler after the measured ones; it counts for nothing
    else. A failure here costs only the kernel table, never the trial."""
    config, rec = state.config, state.rec
    device = state.device_info.torch_device
    i = warmup_steps(config.warmup) + config.steps
    trace = snapshot = None
    if config.trace_dir:
        os.makedirs(config.trace_dir, exist_ok=True)
        stem = rec.precision.replace(":", "_")  # "fp8:keep-ends": no ':' in Windows names
        trace = os.path.join(config.trace_dir, f"{stem}.trace.json")
        if device.type == "cuda":
            snapshot = os.path.join(config.trace_dir, f"{stem}.memory.pickle")
    live = live_tensor_bytes(list(model.parameters()), list(model.buffers()),
                             memtrack.quant_state_tensors(model),
                             list(optimizer.state.values()), batches)
    def step():  # each one is an optimiser step: the held-out loss after counts them
        state.profiled_steps_run += 1
        trial_steps.step(config, rec, device, model, params, optimizer, scaler, batches, i)

    try:
        state.profiled = with_kernel_workspace(against_measured_steps(
            profile_step(step, device, live, trace, snapshot), state.steps), state.memory,
            device.type == "cpu" and not state.compiled and state.memory_timeline is not None)
    except Exception as exc:
        state.profiled_reason = f"the profiled step failed: {type(exc).__name__}: {exc}"
        log(state.profiled_reason, "warning")


def untimed_tail(state: TrialState, model, params, optimizer, scaler, batch, held) -> None:
    """After every step: the held-out loss, then the step that counts lost updates (it puts
    the weights back). A failure here costs only these figures."""
    config, device = state.config, state.device_info.torch_device
    try:
        with untouched(model, device):
            after = held_out.loss(model, state.rec, held, device)
        # warm-up, measured, the memory step, and every step the profiler ran (its shapes
        # step, a memory snapshot's, and its schedule's), failed or not
        steps = (warmup_steps(config.warmup) + config.steps + 1
                 + state.profiled_steps_run)
        state.heldout = held_out.result(state.heldout_before, after, held, steps,
                                         config.data)
    except Exception as exc:
        state.heldout_reason = f"the held-out forward failed: {type(exc).__name__}: {exc}"
    try:
        with untouched(model, device):
            state.lost_updates, reason = measure_lost_updates(
                model, params, optimizer, state.optimizer, scaler, state.rec, batch, device,
                config.lr)
        state.lost_updates_reason = reason or ""
    except Exception as exc:
        optimizer.zero_grad(set_to_none=True)
        state.lost_updates_reason = (f"the lost-update step failed: {type(exc).__name__}: "
                                     f"{exc}")
    release(device)
