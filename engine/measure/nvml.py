"""The one guarded door to NVML.

Lazy initialisation under a lock; a missing library or driver makes ``available()``
false instead of raising; a field this GPU or driver does not report becomes ``None``
(shown as "n/a"). Nothing here raises into the caller.

NVML numbers GPUs its own way (all GPUs, in PCI order), ignoring
``CUDA_VISIBLE_DEVICES``; torch numbers the visible ones. A torch device is therefore
found in NVML by its UUID (or its PCI bus id), never by torch's index.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_state: dict = {"tried": False, "ok": False, "error": None, "lib": None}

PID_METHOD = "NVML compute processes matching the trial's process ids"
BASELINE_METHOD = ("NVML device-wide used memory minus a baseline read before the trial "
                   "started (no NVML process matched our process ids, as happens inside "
                   "containers where NVML reports host process ids)")


def _init() -> bool:
    with _lock:
        if _state["tried"]:
            return _state["ok"]
        _state["tried"] = True
        try:
            import pynvml

            pynvml.nvmlInit()
            _state["lib"] = pynvml
            _state["ok"] = True
        except Exception as exc:  # no library, no driver, no GPU: all mean "no NVML"
            _state["error"] = f"{type(exc).__name__}: {exc}"
        return _state["ok"]


def available() -> bool:
    return _init()


def unavailable_reason() -> str | None:
    return None if _init() else (_state["error"] or "NVML did not initialise")


def query(fn_name: str, *args):
    """Call ``pynvml.<fn_name>(*args)``; ``None`` when NVML or the field is unavailable."""
    if not _init():
        return None
    try:
        with _lock:
            return getattr(_state["lib"], fn_name)(*args)
    except Exception:
        return None


def handle_for(uuid: str | None, pci_bus_id: str | None = None):
    """The NVML handle of the GPU torch knows by ``uuid`` (``pci_bus_id`` as a fallback).

    torch prints a UUID without NVML's prefix: a whole GPU is ``GPU-<uuid>`` in NVML, a
    MIG slice ``MIG-<uuid>``. ``None`` when neither finds the GPU.
    """
    if uuid:
        bare = uuid.removeprefix("GPU-").removeprefix("MIG-")
        for name in (f"GPU-{bare}", f"MIG-{bare}"):
            h = query("nvmlDeviceGetHandleByUUID", name)
            if h is not None:
                return h
    if pci_bus_id:
        return query("nvmlDeviceGetHandleByPciBusId", pci_bus_id)
    return None


def device_static(h) -> dict:
    """Facts that do not change during a run, of the GPU behind handle ``h``."""
    if h is None:
        return {}
    mem = query("nvmlDeviceGetMemoryInfo", h)
    return {
        "name": query("nvmlDeviceGetName", h),
        "driver_version": query("nvmlSystemGetDriverVersion"),
        "total_memory_bytes": int(mem.total) if mem is not None else None,
        "power_limit_w": _milli(query("nvmlDeviceGetEnforcedPowerLimit", h)),
    }


def _milli(value):
    return None if value is None else value / 1000.0


def used_bytes(h) -> int | None:
    """Device-wide used memory (every process, and the driver's own reserve)."""
    mem = query("nvmlDeviceGetMemoryInfo", h) if h is not None else None
    return int(mem.used) if mem is not None else None


def energy_j(h) -> float | None:
    """The GPU's energy counter (joules since the driver loaded; Volta and newer)."""
    mj = query("nvmlDeviceGetTotalEnergyConsumption", h) if h is not None else None
    return mj / 1000.0 if mj is not None else None


def process_memory_bytes(h, pids: set[int]) -> int | None:
    """GPU memory NVML attributes to ``pids`` (compute processes); None if none matches."""
    procs = query("nvmlDeviceGetComputeRunningProcesses", h)
    if procs is None:
        return None
    used = [p.usedGpuMemory for p in procs if p.pid in pids and p.usedGpuMemory is not None]
    return int(sum(used)) if used else None


def process_memory(h, pids: set[int], baseline_bytes: int | None) -> tuple[int | None, str]:
    """Our processes' GPU memory and how it was found.

    By process id first; when no NVML process matches (containers see host pids), the
    device-wide used memory minus ``baseline_bytes`` (read before the trial started).
    """
    if h is None:
        return None, "no NVML handle for this GPU"
    by_pid = process_memory_bytes(h, pids) if pids else None
    if by_pid is not None:
        return by_pid, PID_METHOD
    used = used_bytes(h)
    if used is None or baseline_bytes is None:
        return None, "no NVML process matched our process ids and no baseline was read"
    return max(0, used - baseline_bytes), BASELINE_METHOD


def sample(h, pids: set[int] | None = None, baseline_bytes: int | None = None) -> dict:
    """One poll of the dynamic fields of the GPU behind handle ``h``."""
    if h is None:
        return {}
    util = query("nvmlDeviceGetUtilizationRates", h)
    mem = query("nvmlDeviceGetMemoryInfo", h)
    clock = query("nvmlDeviceGetClockInfo", h, 1)  # NVML_CLOCK_SM
    temp = query("nvmlDeviceGetTemperature", h, 0)  # NVML_TEMPERATURE_GPU
    proc_bytes, proc_method = (process_memory(h, pids, baseline_bytes) if pids
                               else (None, None))
    return {
        "gpu_util_pct": float(util.gpu) if util is not None else None,
        "mem_util_pct": float(util.memory) if util is not None else None,
        "gpu_mem_used_bytes": int(mem.used) if mem is not None else None,
        "gpu_mem_total_bytes": int(mem.total) if mem is not None else None,
        "power_w": _milli(query("nvmlDeviceGetPowerUsage", h)),
        "temperature_c": float(temp) if temp is not None else None,
        "sm_clock_mhz": float(clock) if clock is not None else None,
        "energy_j": energy_j(h),
        "process_mem_bytes": proc_bytes,
        "process_mem_method": proc_method if proc_bytes is not None else None,
    }


def power_method(compute_capability: tuple[int, int] | None) -> str:
    """What ``nvmlDeviceGetPowerUsage`` returns on a GPU of this compute capability.

    NVML documents it as a 1 s average on Ampere and newer except GA100 (the A100 is
    compute capability 8.0) and as an instantaneous reading on GA100 and older GPUs.
    """
    if compute_capability is None:
        return "n/a (no GPU)"
    if tuple(compute_capability) > (8, 0):
        return "NVML power usage: a 1 s average (Ampere and newer, GA100 excepted)"
    return "NVML power usage: an instantaneous reading (GA100 and older GPUs)"
