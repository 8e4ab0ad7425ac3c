"""The one guarded door to AMD SMI (``amdsmi``), NVML's counterpart on ROCm.

The same contract as ``engine.measure.nvml``: lazy initialisation under a lock; a missing
library or driver makes ``available()`` false instead of raising; a field this GPU or
driver does not report becomes ``None`` (shown as "n/a"). The ``amdsmi`` Python package
ships with ROCm, not on PyPI's default path, so it is imported here only when a ROCm
GPU asks and is not a requirement of AmpScope.

Call names, arguments and return shapes are ROCm/amdsmi's ``py-interface/
amdsmi_interface.py`` (commit 0ceca28f); units are its ``amdsmi.h``: VRAM in MB
(MiB: the library divides bytes by 1024 * 1024), socket power in W, the energy
accumulator in ticks of ``counter_resolution`` microjoules, process memory in bytes.
The interface writes ``"N/A"`` for a field the GPU does not fill.

torch on ROCm numbers the visible GPUs (``HIP_VISIBLE_DEVICES``); amdsmi numbers all
of them. A torch device is therefore found by its PCI address, never by torch's index.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_state: dict = {"tried": False, "ok": False, "error": None, "lib": None}

PID_METHOD = "amdsmi process list: VRAM of the processes matching the trial's process ids"
BASELINE_METHOD = ("amdsmi device-wide VRAM used minus a baseline read before the trial "
                   "started (no amdsmi process matched our process ids)")
# what amdsmi cannot say, in the words the monitor and reports show
NO_TENSOR_PIPES = ("n/a: AMD SMI has no matrix-core (MFMA) activity counter; it reports "
                   "graphics-engine (GFX), memory-controller (UMC) and multimedia activity "
                   "only, and MFMA counts need a rocprofiler session")
MIB = 1024 * 1024


def _init() -> bool:
    with _lock:
        if _state["tried"]:
            return _state["ok"]
        _state["tried"] = True
        try:
            import amdsmi

            amdsmi.amdsmi_init()  # default flag: AmdSmiInitFlags.INIT_AMD_GPUS
            _state["lib"] = amdsmi
            _state["ok"] = True
        except Exception as exc:  # not installed, no amdgpu driver: both mean "no amdsmi"
            _state["error"] = f"{type(exc).__name__}: {exc}"
        return _state["ok"]


def available() -> bool:
    return _init()


def unavailable_reason() -> str | None:
    return None if _init() else (_state["error"] or "amdsmi did not initialise")


def query(fn_name: str, *args):
    """Call ``amdsmi.<fn_name>(*args)``; ``None`` when amdsmi or the field is unavailable."""
    if not _init():
        return None
    try:
        with _lock:
            return getattr(_state["lib"], fn_name)(*args)
    except Exception:  # AmdSmiLibraryException (NOT_SUPPORTED, NO_PERM), a retry, ...
        return None


def _number(value) -> float | None:
    """A reading, or ``None`` where the interface wrote "N/A" (or anything not a number)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def bdf(pci_bus_id: str | None) -> str | None:
    """amdsmi's ``dddd:bb:dd.f`` form of NVML's ``dddddddd:bb:dd.f`` (which probe builds)."""
    if not pci_bus_id or pci_bus_id.count(":") != 2:
        return None
    domain, rest = pci_bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def handle_for(pci_bus_id: str | None):
    """The amdsmi processor handle of the GPU at ``pci_bus_id``; ``None`` if none is there."""
    address = bdf(pci_bus_id)
    return query("amdsmi_get_processor_handle_from_bdf", address) if address else None


def device_static(h) -> dict:
    """Facts that do not change during a run, of the GPU behind handle ``h``."""
    if h is None:
        return {}
    driver = query("amdsmi_get_gpu_driver_info", h) or {}
    power = query("amdsmi_get_power_info", h) or {}
    return {
        "driver_version": driver.get("driver_version"),
        "power_limit_w": _number(power.get("power_limit")),
    }


def energy_j(h) -> float | None:
    """The GPU's energy accumulator in joules (ticks x resolution in microjoules)."""
    count = query("amdsmi_get_energy_count", h) if h is not None else None
    if not count:
        return None
    ticks, resolution_uj = (_number(count.get("energy_accumulator")),
                            _number(count.get("counter_resolution")))
    if ticks is None or not resolution_uj:
        return None
    return ticks * resolution_uj / 1e6


def used_bytes(h) -> int | None:
    """Device-wide VRAM used (every process)."""
    vram = query("amdsmi_get_gpu_vram_usage", h) if h is not None else None
    used = _number(vram.get("vram_used")) if vram else None
    return int(used * MIB) if used is not None else None


def free_bytes(h) -> int | None:
    """Device-wide VRAM free: total minus used (every process)."""
    vram = query("amdsmi_get_gpu_vram_usage", h) if h is not None else None
    used, total = (_number(vram.get("vram_used")), _number(vram.get("vram_total"))) if vram \
        else (None, None)
    return int((total - used) * MIB) if used is not None and total is not None else None


def process_memory(h, pids: set[int], baseline_bytes: int | None) -> tuple[int | None, str]:
    """Our processes' VRAM and how it was found: by process id first, else the
    device-wide used VRAM minus ``baseline_bytes`` (read before the trial started)."""
    procs = query("amdsmi_get_gpu_process_list", h) if h is not None else None
    vram = [p["memory_usage"]["vram_mem"] for p in procs or ()
            if p.get("pid") in pids and _number(p["memory_usage"].get("vram_mem")) is not None]
    if vram:
        return int(sum(vram)), PID_METHOD
    used = used_bytes(h)
    if used is None or baseline_bytes is None:
        return None, "no amdsmi process matched our process ids and no baseline was read"
    return max(0, used - baseline_bytes), BASELINE_METHOD


def sample(h, pids: set[int] | None = None, baseline_bytes: int | None = None) -> dict:
    """One poll of the GPU behind ``h``, in ``MonitorSample``'s fields."""
    if h is None:
        return {}
    activity = query("amdsmi_get_gpu_activity", h) or {}
    vram = query("amdsmi_get_gpu_vram_usage", h) or {}
    power = query("amdsmi_get_power_info", h) or {}
    lib = _state["lib"]
    clock = query("amdsmi_get_clock_info", h, lib.AmdSmiClkType.GFX) if lib else None
    used, total = _number(vram.get("vram_used")), _number(vram.get("vram_total"))
    # MI300 fills only the current socket power (its gpu_metrics has no average)
    watts = _number(power.get("current_socket_power"))
    if watts is None:
        watts = _number(power.get("average_socket_power"))
    proc_bytes, proc_method = (process_memory(h, pids, baseline_bytes) if pids
                               else (None, None))
    return {
        "gpu_util_pct": _number(activity.get("gfx_activity")),
        "mem_util_pct": _number(activity.get("umc_activity")),
        "gpu_mem_used_bytes": int(used * MIB) if used is not None else None,
        "gpu_mem_total_bytes": int(total * MIB) if total is not None else None,
        "power_w": watts,
        "sm_clock_mhz": _number((clock or {}).get("clk")),
        "energy_j": energy_j(h),
        "process_mem_bytes": proc_bytes,
        "process_mem_method": proc_method if proc_bytes is not None else None,
    }
