"""Bytes a CPU step's allocator held at its peak that no tensor held: kernels' own buffers.

A bf16 ``mm`` on the CPU runs in oneDNN, which computes into an fp32 buffer of the output's
shape (+128 B) and frees it before returning (T5's LM-head weight gradient at 2 x 32:
268,928 B); with oneDNN off the same ``mm`` allocates only its output. No tensor holds that
buffer, so the tensor tracker (engine.measure.memtrack) and a plan traced on fake tensors
cannot see it, while the profiled step's allocator events can. The measured categories stay
the tensors'; this names the difference beside them.
"""

from __future__ import annotations

import dataclasses

from engine.core.events import MemoryBreakdown, ProfiledStep

PLAN_NOTE = ("a CPU plan counts tensors only: kernels' own buffers (a bf16 matmul's fp32 "
             "output in oneDNN) are not traced; a trial's profiled step names them")


def with_kernel_workspace(ps: ProfiledStep, memory: MemoryBreakdown | None,
                          same_step: bool) -> ProfiledStep:
    """``ps`` with ``kernel_workspace_bytes``: its allocator peak minus the tracked tensor
    peak ``memory.total_bytes``. Only where ``same_step``: a CPU profiled step of the shapes
    and code the tracker watched (eager, same batches); None elsewhere (a GPU's peak is the
    caching allocator's, and there the tracker's total already is that peak)."""
    if not same_step or memory is None or ps.peak_memory_bytes is None:
        return ps
    extra = ps.peak_memory_bytes - memory.total_bytes
    # below zero the tracker counted storages this step's allocator never handed out
    # (another step's): no workspace can be told apart, so none is named
    return dataclasses.replace(ps, kernel_workspace_bytes=extra if extra >= 0 else None)


def workspace_line(ps: ProfiledStep | None) -> str | None:
    """The named line shown under the memory figures, or None where nothing was measured."""
    if ps is None or ps.kernel_workspace_bytes is None or ps.peak_memory_bytes is None:
        return None
    mib = 2 ** 20
    return (f"kernel workspace, not a tensor: {ps.kernel_workspace_bytes / mib:.2f} MiB "
            f"({ps.kernel_workspace_bytes:,} B), the allocator's peak "
            f"{ps.peak_memory_bytes / mib:.2f} MiB ({ps.peak_memory_bytes:,} B)")
