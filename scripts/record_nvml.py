"""Record every NVML call AmpScope makes on this machine, as a JSON replay fixture.

    python3 scripts/record_nvml.py [--out nvml-recording.json]

It drives the app's own NVML code (engine/measure/nvml.py, engine/measure/device.py's probe,
engine/measure/gpm.py, the monitor's tracker, the trial's energy reads) through a proxy of
pynvml that writes down each call: the function, its arguments (a GPU handle as the
UUID NVML gives it) and the result, or the NVML error code it raised. The tests replay
such a file in place of NVML (tests/engine/nvml_replay.py); contributing one from real
hardware (an H100, a MIG slice, a container) replaces a fixture built from documentation.

Each GPU torch sees is probed as ``cuda:N``; GPUs and MIG slices that only NVML sees
(torch without CUDA, or CUDA_VISIBLE_DEVICES) are exercised by their UUID. On a machine
without NVML it writes a file saying so and exits 0 with one line.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FORMAT = "ampscope-nvml/1"


class Recorder:
    """pynvml as the app sees it, writing down each ``nvml*`` call."""

    def __init__(self, lib):
        self._lib = lib
        self.calls: list[dict] = []
        self._labels: dict[int, str] = {}

    def __getattr__(self, name):
        attr = getattr(self._lib, name)
        if not (callable(attr) and name.startswith("nvml")):
            return attr  # constants and ctypes types pass through

        def call(*args):
            entry = {"fn": name, "args": [self.encode(a) for a in args]}
            self.calls.append(entry)
            try:
                result = attr(*args)
            except self._lib.NVMLError as exc:
                entry["error"] = _error_name(self._lib, exc.value)
                raise
            if name == "nvmlGpmMetricsGet":
                entry["result"] = self._metrics(args[0])
            else:
                entry["result"] = self.encode(result)
            return result

        return call

    def label(self, handle) -> str:
        """A handle's stable name: the UUID NVML gives it (asked outside the record)."""
        key = ctypes.cast(handle, ctypes.c_void_p).value
        if key not in self._labels:
            uuid = self._lib.nvmlDeviceGetUUID(handle)
            self._labels[key] = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        return self._labels[key]

    def encode(self, value):
        lib = self._lib
        if isinstance(value, lib.c_nvmlDevice_t):
            return {"handle": self.label(value)}
        if isinstance(value, lib.c_nvmlGpmMetricsGet_t):
            return {"metrics": [_metric_name(lib, value.metrics[i].metricId)
                                for i in range(value.numMetrics)]}
        if type(value).__name__.startswith(("c_nvmlGpmSample", "LP_c_nvmlGpmSample",
                                            "LP_struct_c_nvmlGpmSample")):
            return {"gpm_sample": True}
        if isinstance(value, bytes):
            return value.decode(errors="replace")
        if isinstance(value, list | tuple):
            return [self.encode(v) for v in value]
        if isinstance(value, lib.nvmlFriendlyObject):  # pynvml's process-list entries
            return {k: self.encode(v) for k, v in vars(value).items()}
        if isinstance(value, ctypes.Structure):
            return {f[0]: self.encode(getattr(value, f[0])) for f in value._fields_}
        if isinstance(value, ctypes.Array):
            return [self.encode(v) for v in value]
        return value

    def _metrics(self, request) -> dict:
        lib = self._lib
        out = {}
        for i in range(request.numMetrics):
            m = request.metrics[i]
            name = _metric_name(lib, m.metricId)
            out[name] = (float(m.value) if m.nvmlReturn == lib.NVML_SUCCESS
                         else {"error": _error_name(lib, m.nvmlReturn)})
        return out


def _error_name(lib, code: int) -> str:
    for name in dir(lib):
        if name.startswith("NVML_ERROR_") and getattr(lib, name) == code:
            return name
    return f"NVML_ERROR_{code}"


def _metric_name(lib, metric_id: int) -> str:
    for name in dir(lib):
        if name.startswith("NVML_GPM_METRIC_") and getattr(lib, name) == metric_id:
            return name
    return str(metric_id)


def exercise(info, pid: int, wait=lambda: time.sleep(1.0)) -> dict:
    """The NVML calls a run makes for one GPU, through the app's own code, in a run's
    order: the device monitor (handle by UUID, baseline, a sample, a GPM poll), the
    trial's energy counter and GPM window around ``wait``, then the monitor again.
    ``pid`` is the process whose GPU memory is looked up. Returns what the app read."""
    from engine.measure import nvml
    from engine.measure.gpm import GpmWindow
    from engine.measure.monitor import Monitor

    monitor = Monitor.for_device(info, lambda sample: None)
    tracker = monitor.tracker
    h = getattr(tracker, "handle", None)
    if h is None:
        return {"device": info.name, "nvml_handle": None}
    tracker.pids = {pid}
    tracker.start()
    samples, polls, energy = [tracker.sample()], [monitor.gpm.poll()], [nvml.energy_j(h)]
    window = GpmWindow(info)
    window.start()
    wait()  # an interval for the energy counter and the GPM rates
    gpm = window.stop()
    energy.append(nvml.energy_j(h))
    samples.append(tracker.sample())
    polls.append(monitor.gpm.poll())
    monitor.gpm.close()
    return {"device": info.name, "mig": info.mig, "sm_count": info.sm_count,
            "driver_version": info.driver_version, "samples": samples, "gpm_polls": polls,
            "energy_j": energy, "gpm_window": dataclasses.asdict(gpm)}


def _torch_devices() -> list[dict]:
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        torch.empty(1, device=f"cuda:{i}")  # so this process is on the GPU's process list
        out.append({"index": i, "name": p.name, "major": p.major, "minor": p.minor,
                    "total_memory": int(p.total_memory),
                    "multi_processor_count": p.multi_processor_count,
                    "uuid": str(getattr(p, "uuid", "")) or None,
                    "pci_domain_id": getattr(p, "pci_domain_id", None),
                    "pci_bus_id": getattr(p, "pci_bus_id", None),
                    "pci_device_id": getattr(p, "pci_device_id", None)})
    return out


def _nvml_only_devices(lib, seen_uuids: set[str]) -> list[dict]:
    """GPUs and MIG slices NVML lists that torch did not show us (asked outside the record)."""
    found = []
    for i in range(lib.nvmlDeviceGetCount()):
        h = lib.nvmlDeviceGetHandleByIndex(i)
        handles = [h]
        try:
            for j in range(lib.nvmlDeviceGetMaxMigDeviceCount(h)):
                try:
                    handles.append(lib.nvmlDeviceGetMigDeviceHandleByIndex(h, j))
                except lib.NVMLError:
                    pass
        except lib.NVMLError:
            pass
        for dev in handles:
            uuid = lib.nvmlDeviceGetUUID(dev)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            if uuid.split("-", 1)[-1] in seen_uuids:
                continue
            name = lib.nvmlDeviceGetName(dev)
            try:
                cc = lib.nvmlDeviceGetCudaComputeCapability(dev)
            except lib.NVMLError:
                cc = None
            found.append({"uuid": uuid, "name": name.decode() if isinstance(name, bytes)
                          else name, "compute_capability": list(cc) if cc else None})
    return found


def record(out: Path) -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no library, no driver, no GPU
        reason = f"{type(exc).__name__}: {exc}"
        out.write_text(json.dumps({"format": FORMAT, "nvml": "unavailable", "reason": reason,
                                   "machine": platform.node()}, indent=1))
        return f"NVML is not available here ({reason}); wrote {out} saying so"
    from engine.measure import gpm, nvml
    from engine.measure.device import DeviceInfo, probe

    rec = Recorder(pynvml)
    nvml._state.update(tried=True, ok=True, error=None, lib=rec)
    gpm._lib = lambda: rec
    torch_devices = _torch_devices()
    readings = [exercise(probe(f"cuda:{dev['index']}"), os.getpid()) for dev in torch_devices]
    seen = {str(d["uuid"]).split("-", 1)[-1] for d in torch_devices if d["uuid"]}
    nvml_only = _nvml_only_devices(pynvml, seen)
    for dev in nvml_only:
        cc = tuple(dev["compute_capability"]) if dev["compute_capability"] else None
        info = DeviceInfo("cuda", None, dev["name"], cc, None, None, None, True, True, True,
                          True, uuid=dev["uuid"], mig=dev["uuid"].startswith("MIG-"))
        readings.append(exercise(info, os.getpid()))
    out.write_text(json.dumps({
        "format": FORMAT,
        "source": f"recorded by scripts/record_nvml.py on {platform.node()} "
                  f"({time.strftime('%Y-%m-%d')})",
        "recorder_pid": os.getpid(),
        "torch_devices": torch_devices,
        "nvml_only_devices": nvml_only,
        "calls": rec.calls,
        "app_readings": readings,  # what the app made of the answers, for a reader
    }, indent=1, default=str))
    return f"recorded {len(rec.calls)} NVML calls for {len(torch_devices) + len(nvml_only)} " \
           f"device(s) into {out}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="nvml-recording.json", type=Path)
    args = parser.parse_args(argv)
    print(record(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
