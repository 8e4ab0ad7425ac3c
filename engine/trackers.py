"""One tracker per signal source, each with the same small interface: start / sample / stop.

``StepTimer`` times training steps with CUDA events and synchronises only on the
event it reads; ``AllocatorTracker`` reads the torch caching allocator's counters
(host-side, no sync); ``NvmlTracker`` and ``HostTracker`` feed the monitor thread.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from engine import nvml


@dataclass
class _Mark:
    start: object
    end: object = None


class StepTimer:
    """Times steps on ``device``: CUDA events on a GPU, ``perf_counter`` on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._mark: _Mark | None = None

    def _now(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def start(self) -> None:
        self._mark = _Mark(self._now())

    def stop(self) -> _Mark:
        """End the step; returns a handle to read later with ``sample``."""
        mark, self._mark = self._mark, None
        mark.end = self._now()
        return mark

    def sample(self, mark: _Mark) -> float:
        """Milliseconds of a stopped step. On a GPU this waits for that step only."""
        if self.cuda:
            mark.end.synchronize()
            return float(mark.start.elapsed_time(mark.end))
        return (mark.end - mark.start) * 1000.0


class AllocatorTracker:
    """Peak allocated and reserved bytes of the torch CUDA caching allocator."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self.peak_allocated: int | None = None  # None until a step was sampled
        self.peak_reserved: int | None = None

    def start(self) -> None:
        """Begin a step: the allocator's peak counter restarts (host-side, no sync)."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def sample(self) -> tuple[int | None, int | None]:
        """(peak allocated since ``start``, reserved now); ``None`` on the CPU."""
        if not self.cuda:
            return None, None
        allocated = int(torch.cuda.max_memory_allocated(self.device))
        reserved = int(torch.cuda.max_memory_reserved(self.device))
        self.peak_allocated = max(self.peak_allocated or 0, allocated)
        self.peak_reserved = max(self.peak_reserved or 0, reserved)
        return allocated, reserved

    def stop(self) -> tuple[int | None, int | None]:
        return self.peak_allocated, self.peak_reserved


class NvmlTracker:
    """GPU-wide fields from NVML, plus the memory NVML attributes to our processes."""

    source = "nvml"

    def __init__(self, index: int):
        self.index = index
        self.pids: set[int] = {os.getpid()}

    def start(self) -> None:
        nvml.available()

    def sample(self) -> dict:
        return nvml.sample(self.index, self.pids)

    def stop(self) -> None:
        pass


class HostTracker:
    """CPU load and resident memory of this process and its trial children (psutil)."""

    source = "host"

    def __init__(self):
        import psutil

        self._psutil = psutil
        self._proc = psutil.Process()
        self._children: dict[int, object] = {}

    def start(self) -> None:
        self._psutil.cpu_percent(None)  # first call primes the counter

    def _tree(self) -> list:
        procs = [self._proc]
        try:
            for child in self._proc.children(recursive=True):
                # keep one Process object per pid so cpu_percent has a previous reading
                procs.append(self._children.setdefault(child.pid, child))
        except self._psutil.Error:
            pass
        return procs

    def sample(self) -> dict:
        rss = 0
        for proc in self._tree():
            try:
                rss += proc.memory_info().rss
            except self._psutil.Error:
                continue
        return {
            "cpu_pct": float(self._psutil.cpu_percent(None)),
            "host_rss_bytes": int(rss),
            "host_mem_used_bytes": int(self._psutil.virtual_memory().used),
        }

    def stop(self) -> None:
        self._children.clear()
