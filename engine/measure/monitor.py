"""The device monitor: a thread that polls one tracker at a fixed rate without drifting.

NVML when the run is on an NVIDIA GPU and NVML answers, AMD SMI on a ROCm GPU; the host
(psutil) otherwise. With a
``GpmPoller`` each sample also carries NVML GPM's tensor-pipe, SM and DRAM activity since
the previous poll (Hopper and newer), or once the reason GPM is n/a. Every sample, on a
GPU too, carries the host's load (``engine.measure.contention``): a busy host slows the steps.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from engine.core.events import MonitorSample
from engine.measure import amd_smi
from engine.measure.contention import LoadSampler
from engine.measure.gpm import GpmPoller
from engine.measure.trackers import AmdSmiTracker, HostTracker, NvmlTracker


class Monitor:
    def __init__(self, tracker, emit: Callable[[MonitorSample], None], hz: float = 10.0,
                 gpm: GpmPoller | None = None, load=None):
        self.tracker = tracker
        self.gpm = gpm
        self.load = load  # anything with sample() -> {"load_avg_1m", "other_cpu_pct"}
        self.emit = emit
        self.interval_s = 1.0 / hz
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_device(cls, device_info, emit, hz: float = 10.0, load=None) -> Monitor:
        smi, handle = device_info.telemetry() if device_info.nvml_available else (None, None)
        gpu_tracker = AmdSmiTracker if smi is amd_smi else NvmlTracker
        tracker = gpu_tracker(handle) if handle is not None else HostTracker()
        return cls(tracker, emit, hz, GpmPoller(device_info), load or LoadSampler())

    def watch_pid(self, pid: int) -> None:
        """Count a trial child's GPU memory as ours (NVML or AMD SMI).

        Called as the child starts, before it has imported torch or touched the GPU:
        the device-wide baseline for the no-pid-match fallback is read here.
        """
        if isinstance(self.tracker, NvmlTracker):
            self.tracker.take_baseline()
            self.tracker.pids.add(pid)

    def start(self) -> None:
        self.tracker.start()
        self._thread = threading.Thread(target=self._loop, name="ampscope-monitor", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            # stamped as the readings begin: a sample inside a trial's window was read inside it
            stamp = time.time()
            fields = self.tracker.sample()
            if self.gpm is not None:
                fields.update(self.gpm.poll())
            if self.load is not None:
                fields.update(self.load.sample())
            self.emit(MonitorSample(time_s=stamp, source=self.tracker.source, **fields))
            next_t += self.interval_s  # schedule from the plan, not from now: no drift
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind (a slow poll): skip missed ticks instead of bursting
                next_t = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.gpm is not None:
            self.gpm.close()
        self.tracker.stop()
