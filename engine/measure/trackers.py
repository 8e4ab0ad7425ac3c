"""One tracker per signal source, each with the same small interface: start / sample / stop.

``StepTimer`` times training steps with CUDA events and synchronises only on the
event it reads; ``ScalarReadback`` brings a step's scalars to the host without a
sync; ``AllocatorTracker`` reads the torch caching allocator's counters (host-side,
no sync); ``NvmlTracker`` (``AmdSmiTracker`` on ROCm) and ``HostTracker`` feed the monitor thread.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from engine.measure import amd_smi, nvml
from engine.measure.process_tree import descendant_pids


@dataclass
class _Mark:
    start: object
    end: object = None


class StepTimer:
    """Times steps on ``device``: CUDA events on a GPU, ``perf_counter`` on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self._mark: _Mark | None = None

    def now(self):
        """A time mark: a CUDA event recorded now, or ``perf_counter``."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            # the trial device's stream, named: the current device may be another GPU
            event.record(torch.cuda.current_stream(self.device))
            return event
        return time.perf_counter()

    def start(self, at=None) -> None:
        """Start a step now, or at an earlier mark from ``now()``."""
        self._mark = _Mark(self.now() if at is None else at)

    def stop(self) -> _Mark:
        """End the step; returns a handle to read later with ``sample``."""
        mark, self._mark = self._mark, None
        mark.end = self.now()
        return mark

    def sample(self, mark: _Mark) -> float:
        """Milliseconds of a stopped step. On a GPU this waits for that step only."""
        if self.cuda:
            mark.end.synchronize()
            return float(mark.start.elapsed_time(mark.end))
        return (mark.end - mark.start) * 1000.0


@dataclass
class _Pending:
    slot: int
    present: tuple[bool, ...]
    done: object = None  # CUDA event recorded after the copy
    values: object = None  # the CPU path keeps the tensors themselves


class ScalarReadback:
    """A step's scalar tensors (loss, grad norm, loss scale) read one step later, no sync.

    ``.item()`` on a GPU tensor waits for the whole stream, so the GPU would drain at
    every step. Instead ``push`` copies the scalars into a pinned host buffer with
    ``non_blocking=True`` and records an event after the copy; ``read`` waits for that
    event only, by which time the next step is already queued behind it.
    """

    def __init__(self, device: torch.device, width: int, slots: int = 4):
        self.cuda = device.type == "cuda"
        self.device = device
        self.slots = slots
        self._next = 0
        self._host = (torch.empty((slots, width), dtype=torch.float64, pin_memory=True)
                      if self.cuda else None)

    def push(self, values: list) -> _Pending:
        """Queue ``values`` (0-d tensors or ``None``); the handle reads them later."""
        present = tuple(v is not None for v in values)
        slot, self._next = self._next, (self._next + 1) % self.slots
        if not self.cuda:
            return _Pending(slot, present, values=[v.detach() if v is not None else None
                                                   for v in values])
        zero = torch.zeros((), dtype=torch.float64, device=self.device)
        stacked = torch.stack([
            v.detach().reshape(()).to(device=self.device, dtype=torch.float64)
            if v is not None else zero for v in values])
        self._host[slot].copy_(stacked, non_blocking=True)
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(self.device))
        return _Pending(slot, present, done=done)

    def read(self, pending: _Pending) -> list[float | None]:
        """The values of a ``push``; waits for that copy's event only (GPU)."""
        if not self.cuda:
            return [float(v.item()) if v is not None else None for v in pending.values]
        pending.done.synchronize()
        row = self._host[pending.slot].tolist()
        return [x if keep else None for x, keep in zip(row, pending.present)]


class LateScalars:
    """Numbers and 0-d tensors of one moment (a step's lr of each parameter group, values
    ``rec.log`` got), read later as ``ScalarReadback`` reads a step's: on a GPU the tensors
    are copied into pinned host memory behind the work that made them and a read waits for
    that copy's event only, where ``.item()`` would wait for every kernel queued since. Their
    number varies, so each moment has a buffer of its own rather than a slot of a ring."""

    def __init__(self, values: list):
        self._values = [v.detach().reshape(()).clone() if isinstance(v, torch.Tensor) else v
                        for v in values]
        self._cuda = [i for i, v in enumerate(self._values)
                      if isinstance(v, torch.Tensor) and v.is_cuda]
        self._read: list[float | None] | None = None
        if self._cuda:
            device = self._values[self._cuda[0]].device
            stacked = torch.stack([self._values[i].to(device=device, dtype=torch.float64)
                                   for i in self._cuda])
            self._host = torch.empty(len(self._cuda), dtype=torch.float64, pin_memory=True)
            self._host.copy_(stacked, non_blocking=True)
            self._done = torch.cuda.Event()
            self._done.record(torch.cuda.current_stream(device))

    def value(self, i: int) -> float | None:
        """The ``i``-th value as a float (None for None); the first call reads them all."""
        if self._read is None:
            # the CPU's tensors: no device to wait for; the GPU's come from the host copy
            read = [v if not isinstance(v, torch.Tensor) else None if v.is_cuda else v.item()
                    for v in self._values]
            if self._cuda:
                self._done.synchronize()
                for i, x in zip(self._cuda, self._host.tolist()):
                    read[i] = x
            self._read = [None if v is None else float(v) for v in read]
        return self._read[i]


class AllocatorTracker:
    """Peak allocated and reserved bytes of the torch CUDA caching allocator.

    Warm-up steps and measured steps keep separate peaks, so a label can say which
    steps a peak covers (warm-up holds compilation and the first optimiser-state
    allocation).
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self.peaks: dict[bool, tuple[int, int]] = {}  # measured? -> (allocated, reserved)
        self.steps: dict[bool, int] = {True: 0, False: 0}

    def start(self) -> None:
        """Begin a step: the allocator's peak counter restarts (host-side, no sync)."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def sample(self, measured: bool = True) -> tuple[int | None, int | None]:
        """(peak allocated, peak reserved) since ``start``; ``None`` on the CPU."""
        if not self.cuda:
            return None, None
        allocated = int(torch.cuda.max_memory_allocated(self.device))
        reserved = int(torch.cuda.max_memory_reserved(self.device))
        old_a, old_r = self.peaks.get(measured, (0, 0))
        self.peaks[measured] = (max(old_a, allocated), max(old_r, reserved))
        self.steps[measured] += 1
        return allocated, reserved

    def stop(self) -> tuple[int | None, int | None, str]:
        """(peak allocated, peak reserved, which steps they cover)."""
        if True in self.peaks:
            a, r = self.peaks[True]
            warm = self.steps[False]
            return a, r, (f"over the {self.steps[True]} measured steps; "
                          f"{warm} warm-up step{'s' * (warm != 1)} and the FLOP-counting "
                          "probe excluded")
        if False in self.peaks:
            a, r = self.peaks[False]
            return a, r, (f"over {self.steps[False]} warm-up steps only (no measured step "
                          "ran)")
        return None, None, "no step ran"

    def reserved_now(self) -> int | None:
        return int(torch.cuda.memory_reserved(self.device)) if self.cuda else None


class NvmlTracker:
    """GPU-wide fields from NVML, plus the memory NVML attributes to our processes.

    ``handle`` is the GPU's NVML handle, found by UUID (NVML's own numbering ignores
    ``CUDA_VISIBLE_DEVICES``). Where no NVML process matches our pids (containers),
    process memory is the device-wide used memory minus ``baseline_bytes``, read each
    time a trial process is about to start.
    """

    source = "nvml"
    smi = nvml  # the guarded query module the fields come from

    def __init__(self, handle):
        self.handle = handle
        self.pids: set[int] = {os.getpid()}
        self.baseline_bytes: int | None = None

    def start(self) -> None:
        self.take_baseline()

    def take_baseline(self) -> None:
        self.baseline_bytes = self.smi.used_bytes(self.handle)

    def sample(self) -> dict:
        return self.smi.sample(self.handle, self.pids, self.baseline_bytes)

    def stop(self) -> None:
        pass


class AmdSmiTracker(NvmlTracker):
    """The same fields from AMD SMI on a ROCm GPU (``handle`` found by PCI address)."""

    source = "amdsmi"
    smi = amd_smi


class HostTracker:
    """CPU use and resident memory of this process and its descendants (trial children,
    data-loader workers), from psutil: not the machine's, which other work would fill.

    Finding the descendants (engine.measure.process_tree) is the costly part of a poll where the
    whole process table must be walked (not Linux: tens of ms with many processes), so it
    is redone every ``CHILDREN_REFRESH_S`` only; each poll reads the known processes'
    counters alone.
    """

    source = "host"
    CHILDREN_REFRESH_S = 2.0

    def __init__(self):
        import psutil

        self._psutil = psutil
        self._proc = psutil.Process()
        self._children: dict[int, object] = {}
        self._walked_s: float | None = None

    def start(self) -> None:
        self._proc.cpu_percent(None)  # the first call primes the counter
        self._walk()

    def _walk(self) -> None:
        try:
            found = descendant_pids(self._proc)
        except self._psutil.Error:
            found = []
        # one Process object per pid, kept, so cpu_percent has a previous reading
        known = {}
        for pid in found:
            proc = self._children.get(pid)
            if proc is None:
                try:
                    proc = self._psutil.Process(pid)
                    proc.cpu_percent(None)
                except self._psutil.Error:  # it ended since the walk
                    continue
            known[pid] = proc
        self._children = known
        self._walked_s = time.monotonic()

    def sample(self) -> dict:
        if self._walked_s is None or time.monotonic() - self._walked_s >= self.CHILDREN_REFRESH_S:
            self._walk()
        cpu, rss = 0.0, 0
        for proc in (self._proc, *self._children.values()):
            try:
                with proc.oneshot():
                    cpu += proc.cpu_percent(None)  # percent of one core, since the last poll
                    rss += proc.memory_info().rss
            except self._psutil.Error:  # a child that ended since the last walk
                continue
        return {
            "cpu_pct": float(cpu),
            "host_rss_bytes": int(rss),
            "host_mem_used_bytes": int(self._psutil.virtual_memory().used),
        }

    def stop(self) -> None:
        self._children.clear()
