"""A watched step's memory as a MemoryBreakdown, one builder for a profile trial, a user's
run (ampscope.Recorder) and the plan's traced step: the categories held at the peak, the
allocator's peak beside them where the device has one, and notes saying what each means."""

from __future__ import annotations

from engine.core.events import MemoryBreakdown
from engine.measure.memtrack import MeasuredPeak

ALLOCATOR_NOTE = ("torch.cuda.max_memory_allocated {covers} stands beside it: it also sees "
                  "kernels' scratch memory (cuBLAS workspaces) that no tensor holds")


def breakdown_fields(measured: MeasuredPeak, method: str) -> dict:
    """MemoryBreakdown's fields from a watched step (measured, or traced on fake tensors
    by engine.run.plan)."""
    at = measured.at_peak
    return dict(
        params_bytes=at["params"],
        buffers_bytes=at["buffers"],
        quant_state_bytes=at["quant_state"],
        grads_bytes=at["grads"],
        optimizer_bytes=at["optimizer"],
        inputs_bytes=at["inputs"],
        weight_copies_bytes=at["weight_copies"],
        activations_bytes=at["activations"],
        activations_method="storages made inside a module's forward (checkpointed layers' "
                           "recomputed forward included) alive at the peak",
        temporaries_bytes=at["temporaries"],
        total_bytes=measured.peak_bytes,
        total_method=method,
        peak_phase=measured.phase,
        at_phase_start_bytes=measured.at_phase_start,
    )


def watched_memory(measured: MeasuredPeak, method: str, allocator: tuple, notes: str,
                   gpu_notes: str = "", **gpu_fields) -> MemoryBreakdown:
    """``allocator``: AllocatorTracker.stop()'s (peak allocated, peak reserved, what it
    covers), peak None on the CPU; ``notes``: what the categories are; ``gpu_notes`` and
    ``gpu_fields`` (NVML's figures) join them where the allocator has a peak."""
    fields = breakdown_fields(measured, method)
    peak_alloc, peak_res, covers = allocator
    if peak_alloc is None:
        return MemoryBreakdown(**fields, notes=notes)
    return MemoryBreakdown(
        **fields, peak_allocated_bytes=peak_alloc, peak_reserved_bytes=peak_res, **gpu_fields,
        notes=f"{notes}. {ALLOCATOR_NOTE.format(covers=covers)}{gpu_notes}")
