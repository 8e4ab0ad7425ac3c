"""NVML replay: recordings (tests/data/nvml, scripts/record_nvml.py's format) answer for
NVML while the app's own monitor, probe, energy and GPM code runs, in the order a run
makes its calls (``record_nvml.exercise``, the same function the recorder drives)."""

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.measure import nvml
from engine.measure.device import probe
from tests.engine.nvml_replay import DATA, Handle, install

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("record_nvml", ROOT / "scripts" / "record_nvml.py")
record_nvml = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(record_nvml)


def _answers(recording: dict, fn: str) -> list:
    return [c.get("result", c.get("error")) for c in recording["calls"] if c["fn"] == fn]


def _run(monkeypatch, name: str):
    replay = install(monkeypatch, name)
    info = probe("cuda:0")
    # a GPM window shorter than 0.2 s is n/a (engine/measure/gpm.py): wait past it
    readings = record_nvml.exercise(info, replay.recording["recorder_pid"],
                                    wait=lambda: time.sleep(0.25))
    assert replay.unrecorded == [], "the app made NVML calls the recording does not have"
    return replay.recording, info, readings, replay


@pytest.mark.parametrize("name", sorted(p.stem for p in DATA.glob("*.json")))
def test_every_fixture_says_where_it_came_from(name):
    recording = json.loads((DATA / f"{name}.json").read_text())
    assert recording["format"] == record_nvml.FORMAT
    source = recording["source"]
    assert source.startswith(("recorded by scripts/record_nvml.py", "documented behaviour: "))
    if source.startswith("documented"):
        assert "docs.nvidia.com/deploy/nvml-api" in source


def test_h100_found_by_uuid_and_read_by_pid(monkeypatch):
    rec, info, got, _ = _run(monkeypatch, "h100_sxm")
    uuid = "GPU-" + rec["torch_devices"][0]["uuid"]
    assert info.nvml_handle() == Handle(uuid)  # NVML's second GPU, not index 0
    assert info.driver_version == _answers(rec, "nvmlSystemGetDriverVersion")[0]
    assert not info.mig and info.sm_count == rec["torch_devices"][0]["multi_processor_count"]
    ours = sum(p["usedGpuMemory"] for p in _answers(rec, "nvmlDeviceGetComputeRunningProcesses")[0]
               if p["pid"] == rec["recorder_pid"])
    first = got["samples"][0]
    assert (first["process_mem_bytes"], first["process_mem_method"]) == (ours, nvml.PID_METHOD)
    assert first["gpu_util_pct"] == _answers(rec, "nvmlDeviceGetUtilizationRates")[0]["gpu"]
    assert first["power_w"] == _answers(rec, "nvmlDeviceGetPowerUsage")[0] / 1000
    counter = _answers(rec, "nvmlDeviceGetTotalEnergyConsumption")
    assert got["energy_j"][1] - got["energy_j"][0] == pytest.approx((counter[2] - counter[1]) / 1e3)
    metrics = _answers(rec, "nvmlGpmMetricsGet")[0]
    window = got["gpm_window"]
    assert window["reason"] is None
    assert window["tensor_any_util_pct"] == metrics["NVML_GPM_METRIC_ANY_TENSOR_UTIL"]
    assert got["gpm_polls"][1]["gpm_sm_util_pct"] == metrics["NVML_GPM_METRIC_SM_UTIL"]


def test_mig_slice_found_as_mig_uuid_with_its_own_memory_and_na_fields(monkeypatch):
    rec, info, got, _ = _run(monkeypatch, "h100_mig_1g10gb")
    assert info.nvml_handle() == Handle("MIG-" + rec["torch_devices"][0]["uuid"])
    assert info.mig
    sample = got["samples"][0]
    mem = _answers(rec, "nvmlDeviceGetMemoryInfo")[0]
    assert sample["gpu_mem_total_bytes"] == mem["total"]  # the GPU instance, not the GPU
    assert _answers(rec, "nvmlDeviceGetUtilizationRates") == ["NVML_ERROR_NOT_SUPPORTED"]
    assert sample["gpu_util_pct"] is None and sample["mem_util_pct"] is None
    assert sample["power_w"] is None and sample["energy_j"] is None
    assert got["energy_j"] == [None, None]
    assert sample["process_mem_method"] == nvml.PID_METHOD
    assert "nvmlGpmQueryDeviceSupport failed" in got["gpm_window"]["reason"]
    assert got["gpm_window"]["tensor_any_util_pct"] is None


def test_container_host_pids_fall_back_to_the_baseline(monkeypatch):
    rec, info, got, _ = _run(monkeypatch, "container_host_pids")
    assert rec["torch_devices"][0]["uuid"] is None
    assert info.nvml_handle() == Handle(_answers(rec, "nvmlDeviceGetHandleByPciBusId")[0]["handle"])
    listed = {p["pid"] for p in _answers(rec, "nvmlDeviceGetComputeRunningProcesses")[0]}
    assert rec["recorder_pid"] not in listed
    used = [m["used"] for m in _answers(rec, "nvmlDeviceGetMemoryInfo")]
    baseline = used[1]  # read by the tracker's start, before the trial touched the GPU
    for sample, now in zip(got["samples"], (used[3], used[5]), strict=True):
        assert sample["process_mem_method"] == nvml.BASELINE_METHOD
        assert sample["process_mem_bytes"] == now - baseline
    assert got["samples"][1]["process_mem_bytes"] > 0


def test_gpu_without_gpm_says_why_and_is_never_asked(monkeypatch):
    rec, info, got, replay = _run(monkeypatch, "a100_no_gpm")
    reason = got["gpm_window"]["reason"]
    assert "8.0" in reason and "Hopper" in reason
    assert got["gpm_polls"][0] == {"gpm_reason": reason}
    assert not [fn for fn in replay.made if fn.startswith("nvmlGpm")]
    counter = _answers(rec, "nvmlDeviceGetTotalEnergyConsumption")
    assert got["energy_j"][1] - got["energy_j"][0] == pytest.approx((counter[2] - counter[1]) / 1e3)


def test_recorder_without_nvml_writes_a_file_saying_so(tmp_path):
    out = tmp_path / "rec.json"
    done = subprocess.run([sys.executable, "scripts/record_nvml.py", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    if json.loads(out.read_text()).get("nvml") != "unavailable":
        pytest.skip("this machine has NVML: the recorder recorded it")
    assert done.returncode == 0 and len(done.stdout.strip().splitlines()) == 1
    assert "NVML is not available" in done.stdout
    assert json.loads(out.read_text())["reason"]


class _DriverLike:
    """pynvml's own types and errors, answering like a driver would (ctypes structs,
    device pointers, friendly objects): what the recorder sees on real hardware."""

    def __init__(self):
        import pynvml

        self._pynvml = pynvml
        self.device = pynvml.c_nvmlDevice_t(pynvml.struct_c_nvmlDevice_t())

    def __getattr__(self, name):
        return getattr(self._pynvml, name)

    def nvmlDeviceGetUUID(self, h):
        return "GPU-feedface-0000-4000-8000-000000000001"

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid != self.nvmlDeviceGetUUID(self.device):
            raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_NOT_FOUND)
        return self.device

    def nvmlDeviceGetMemoryInfo(self, h):
        return self._pynvml.c_nvmlMemory_t(total=80 * 2**30, free=60 * 2**30, used=20 * 2**30)

    def nvmlDeviceGetUtilizationRates(self, h):
        raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1755

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 50

    def nvmlDeviceGetPowerUsage(self, h):
        return 250_500

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return 123_456_789

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [self._pynvml.nvmlFriendlyObject({"pid": 77, "usedGpuMemory": 5 * 2**30}),
                self._pynvml.nvmlFriendlyObject({"pid": 78, "usedGpuMemory": None})]


def test_a_recording_replays_to_the_same_readings(monkeypatch, tmp_path):
    """scripts/record_nvml.py's Recorder in front of driver-like answers, then the
    replayer from its file: the app reads the same through both."""
    from engine.measure import gpm

    rec = record_nvml.Recorder(_DriverLike())
    monkeypatch.setattr(nvml, "_state", {"tried": True, "ok": True, "error": None, "lib": rec})
    monkeypatch.setattr(gpm, "_lib", lambda: rec)
    uuid = "feedface-0000-4000-8000-000000000001"
    h = nvml.handle_for(uuid)
    live = nvml.sample(h, {77}, 2**30), nvml.energy_j(h)
    path = tmp_path / "recording.json"
    path.write_text(json.dumps({"format": record_nvml.FORMAT, "source": "recorded by "
                                "scripts/record_nvml.py on a test double", "calls": rec.calls}))
    replay = install(monkeypatch, path)
    h = nvml.handle_for(uuid)
    assert h == Handle("GPU-" + uuid)
    assert (nvml.sample(h, {77}, 2**30), nvml.energy_j(h)) == live
    assert replay.unrecorded == []
    assert live[0]["process_mem_bytes"] == 5 * 2**30 and live[0]["gpu_util_pct"] is None
