"""The memory figure a trial's summary (and so every table and the verdict) reports: the
peak of the steps that were timed.

The memory step that splits the peak into categories runs eagerly (the memory watcher
cannot see inside compiled kernels). Eager kernels keep intermediates that compiled ones
fuse away: on an H200, GPT-2 at batch 8 x 1024 in bf16-amp peaked at 13.07 GB in the eager
step and 7.12 GB in its compiled steps (fp8: 12.9 vs 6.1 GB). A compiled trial's peak is
therefore the allocator's over its compiled measured steps; where the device has no
allocator statistics (the CPU) it cannot be read, and is n/a with that reason rather than
the eager step's figure.
"""

from __future__ import annotations

import dataclasses

from engine.core.events import MemoryBreakdown

CPU_COMPILED_REASON = (
    "n/a: the compiled steps' peak cannot be read on this device (no allocator statistics); "
    "the eager memory step's peak ({eager}) is in the memory breakdown and would overstate "
    "what the compiled steps hold")


def timed_peak(memory: MemoryBreakdown | None,
               compiled: bool | None) -> tuple[MemoryBreakdown | None, str]:
    """(the breakdown whose ``total_bytes`` the summary reports, the reason when None).

    An eager trial's watched step ran as its timed steps did: its peak stands. A compiled
    trial's total becomes the allocator's peak over the compiled measured steps, named so."""
    if memory is None or not compiled:
        return memory, "not measured"
    if memory.peak_allocated_bytes is None:
        return None, CPU_COMPILED_REASON.format(eager=_gb(memory.total_bytes))
    if memory.total_bytes == memory.peak_allocated_bytes:  # already the compiled steps' own
        return memory, ""
    return dataclasses.replace(
        memory, total_bytes=memory.peak_allocated_bytes,
        total_method=("torch.cuda.max_memory_allocated over the compiled measured steps (the "
                      f"eager memory step that gives the categories peaked at "
                      f"{_gb(memory.total_bytes)}: eager kernels keep what compiled ones "
                      "fuse away)")), ""


def _gb(value: int) -> str:
    return f"{value / 1e9:.2f} GB"
