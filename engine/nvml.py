"""The one guarded door to NVML.

Lazy initialisation under a lock; a missing library or driver makes ``available()``
false instead of raising; a field this GPU or driver does not report becomes ``None``
(shown as "n/a"). Nothing here raises into the caller.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_state: dict = {"tried": False, "ok": False, "error": None, "lib": None}


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


def handle(index: int):
    return query("nvmlDeviceGetHandleByIndex", index)


def device_static(index: int) -> dict:
    """Facts that do not change during a run."""
    h = handle(index)
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


def process_memory_bytes(h, pids: set[int]) -> int | None:
    """GPU memory NVML attributes to ``pids`` (compute processes); None if not reported."""
    procs = query("nvmlDeviceGetComputeRunningProcesses", h)
    if procs is None:
        return None
    used = [p.usedGpuMemory for p in procs if p.pid in pids and p.usedGpuMemory is not None]
    return int(sum(used)) if used else None


def sample(index: int, pids: set[int] | None = None) -> dict:
    """One poll of the dynamic fields of GPU ``index``."""
    h = handle(index)
    if h is None:
        return {}
    util = query("nvmlDeviceGetUtilizationRates", h)
    mem = query("nvmlDeviceGetMemoryInfo", h)
    energy_mj = query("nvmlDeviceGetTotalEnergyConsumption", h)
    clock = query("nvmlDeviceGetClockInfo", h, 1)  # NVML_CLOCK_SM
    temp = query("nvmlDeviceGetTemperature", h, 0)  # NVML_TEMPERATURE_GPU
    return {
        "gpu_util_pct": float(util.gpu) if util is not None else None,
        "mem_util_pct": float(util.memory) if util is not None else None,
        "gpu_mem_used_bytes": int(mem.used) if mem is not None else None,
        "gpu_mem_total_bytes": int(mem.total) if mem is not None else None,
        "power_w": _milli(query("nvmlDeviceGetPowerUsage", h)),
        "temperature_c": float(temp) if temp is not None else None,
        "sm_clock_mhz": float(clock) if clock is not None else None,
        "energy_j": energy_mj / 1000.0 if energy_mj is not None else None,
        "process_mem_bytes": process_memory_bytes(h, pids) if pids else None,
    }
