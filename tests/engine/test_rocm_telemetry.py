"""ROCm: an MI300X under torch's ROCm build, read through a fake ``amdsmi``.

torch's ROCm build answers through ``torch.cuda`` (``torch.version.hip`` set,
``torch.version.cuda`` None, a ``gcnArchName`` in the device properties). The fake
``amdsmi`` module answers with the shapes ROCm/amdsmi's Python interface returns
(``py-interface/amdsmi_interface.py`` at commit 0ceca28f: dicts with these keys, "N/A"
where the C struct holds 0xFFFF; units from ``include/amd_smi/amdsmi.h``: VRAM in MB
(bytes / 1024 / 1024), socket power in W, energy ticks of ``counter_resolution`` uJ,
process memory in bytes). MI300's gpu_metrics fill the current socket power only, so
``average_socket_power`` is "N/A", as is ``mm_activity`` (no multimedia engine counter).
"""

from __future__ import annotations

import enum
import os
import sys
import threading
import types
from types import SimpleNamespace

import pytest
import torch

import engine.measure.device as device_mod
from engine.core.recipes import recipe
from engine.measure import amd_smi, peak_choice, peaks
from engine.measure.device import probe
from engine.measure.monitor import Monitor
from engine.measure.trackers import AmdSmiTracker
from engine.run import trial_steps

# torch.cuda.get_device_properties on an MI300X (ROCm reports it as 9.4, 304 CUs)
MI300X = SimpleNamespace(name="AMD Instinct MI300X", major=9, minor=4,
                         multi_processor_count=304, total_memory=196_592 * 2**20,
                         gcnArchName="gfx942:sramecc+:xnack-", uuid="b3d4a7c1-3e2f",
                         pci_domain_id=0, pci_bus_id=0x05, pci_device_id=0)
VRAM_TOTAL_MB, MiB = 196_592, 2**20
RESOLUTION_UJ = 15.259  # the counter resolution amdsmi reports on MI300X, in microjoules


class AmdSmiClkType(enum.IntEnum):  # amdsmi_interface.AmdSmiClkType (values illustrative)
    SYS = 0
    GFX = 1


class AmdSmiLibraryException(Exception):
    """amdsmi_exception.AmdSmiLibraryException: what a NOT_SUPPORTED call raises."""


class FakeAmdSmi(types.ModuleType):
    """``import amdsmi`` as the app sees it, for one MI300X at PCI 0000:05:00.0."""

    def __init__(self):
        super().__init__("amdsmi")
        self.AmdSmiClkType = AmdSmiClkType
        self.handle = object()  # an amdsmi_processor_handle: opaque to the app
        self.vram_used_mb = 1_024
        self.energy_ticks = 1_000_000
        self.procs: list[dict] = []
        self.calls: list[str] = []
        self.inited = False

    def __getattribute__(self, name):
        if name.startswith("amdsmi_"):
            object.__getattribute__(self, "calls").append(name)
        return object.__getattribute__(self, name)

    def amdsmi_init(self, flag=None):
        self.inited = True

    def amdsmi_get_processor_handle_from_bdf(self, bdf):
        if bdf != "0000:05:00.0":
            raise AmdSmiLibraryException("AMDSMI_STATUS_NOT_FOUND")
        return self.handle

    def amdsmi_get_gpu_driver_info(self, h):
        return {"driver_name": "amdgpu", "driver_version": "6.10.5", "driver_date": "2015/01/01"}

    def amdsmi_get_gpu_activity(self, h):
        return {"gfx_activity": 87, "umc_activity": 41, "mm_activity": "N/A"}

    def amdsmi_get_gpu_vram_usage(self, h):
        return {"vram_total": VRAM_TOTAL_MB, "vram_used": self.vram_used_mb}

    def amdsmi_get_power_info(self, h):
        return {"current_socket_power": 612, "average_socket_power": "N/A",
                "gfx_voltage": "N/A", "soc_voltage": "N/A", "mem_voltage": "N/A",
                "power_limit": 750}

    def amdsmi_get_energy_count(self, h):
        return {"power": self.energy_ticks, "energy_accumulator": self.energy_ticks,
                "counter_resolution": RESOLUTION_UJ, "timestamp": 1_732_000_000_000}

    def amdsmi_get_clock_info(self, h, clock_type):
        assert clock_type is AmdSmiClkType.GFX
        return {"clk": 2100, "min_clk": 500, "max_clk": 2100, "clk_locked": 0,
                "clk_deep_sleep": 0}

    def amdsmi_get_gpu_process_list(self, h):
        return [{"name": "python3", "pid": pid, "mem": vram,
                 "engine_usage": {"gfx": 10**9, "enc": 0},
                 "memory_usage": {"gtt_mem": 2 * MiB, "cpu_mem": 0, "vram_mem": vram}}
                for pid, vram in self.procs]


@pytest.fixture
def mi300x(monkeypatch):
    """The real probe on a ROCm machine with one MI300X, amdsmi importable and fake."""
    fake = FakeAmdSmi()
    monkeypatch.setitem(sys.modules, "amdsmi", fake)
    monkeypatch.setattr(amd_smi, "_state", {"tried": False, "ok": False, "error": None,
                                            "lib": None})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=0: MI300X)
    monkeypatch.setattr(device_mod.torch.version, "cuda", None)
    monkeypatch.setattr(device_mod.torch.version, "hip", "6.4.43482-0f2d60242", raising=False)
    return fake, probe("cuda")


info_reasons: list[str] = []  # every gpm_reason the last monitor emitted


def _monitor_samples(info, count: int, once_started=None):
    """``count`` samples from the real monitor thread for ``info``, taken after
    ``once_started(monitor)`` ran (the trial child starting)."""
    samples, enough, ready = [], threading.Event(), threading.Event()
    info_reasons.clear()

    def emit(sample):
        if sample.gpm_reason:
            info_reasons.append(sample.gpm_reason)
        if ready.is_set():
            samples.append(sample)
        if len(samples) >= count:
            enough.set()

    monitor = Monitor.for_device(info, emit, hz=50.0)
    monitor.start()
    if once_started:
        once_started(monitor)
    ready.set()
    enough.wait(60)
    monitor.stop()
    return monitor, samples


def test_an_mi300x_is_probed_as_rocm_and_watched_through_amdsmi(mi300x):
    fake, info = mi300x
    assert fake.inited and info.kind == "cuda" and info.gcn_arch == "gfx942"
    assert info.nvml_available  # the GPU's telemetry library answers: AMD SMI here
    assert info.driver_version == "6.10.5" and info.cuda_version is None
    assert info.describe() == "AMD Instinct MI300X (gfx942, ROCm/HIP 6.4.43482-0f2d60242)"
    assert "AMD SMI" in info.power_method

    def child_started(monitor):  # the baseline is read as the trial child starts
        monitor.watch_pid(4242)
        fake.vram_used_mb = 1_024 + 3_000

    monitor, samples = _monitor_samples(info, 3, child_started)
    assert isinstance(monitor.tracker, AmdSmiTracker)
    first = samples[-1]
    assert first.source == "amdsmi"
    assert (first.gpu_util_pct, first.mem_util_pct) == (87.0, 41.0)
    assert first.gpu_mem_used_bytes == (1_024 + 3_000) * MiB
    assert first.gpu_mem_total_bytes == VRAM_TOTAL_MB * MiB
    assert first.power_w == 612.0  # the current reading: MI300 has no average
    assert first.sm_clock_mhz == 2100.0
    assert first.energy_j == pytest.approx(1_000_000 * RESOLUTION_UJ / 1e6)
    # the container case: no amdsmi process is ours, so VRAM used minus the baseline
    assert first.process_mem_bytes == 3_000 * MiB
    assert first.process_mem_method == amd_smi.BASELINE_METHOD
    # tensor-pipe activity: n/a with the reason, said once, and NVML's GPM never asked
    assert info_reasons == [f"{amd_smi.NO_TENSOR_PIPES} (AMD Instinct MI300X, gfx942)"]
    assert all(s.gpm_tensor_any_util_pct is None for s in samples)
    assert first.temperature_c is None


def test_process_vram_by_pid_when_amdsmi_lists_our_process(mi300x):
    fake, info = mi300x
    fake.procs = [(os.getpid(), 5 * 2**30), (999_999, 7 * 2**30)]
    _, samples = _monitor_samples(info, 1)
    assert samples[0].process_mem_bytes == 5 * 2**30
    assert samples[0].process_mem_method == amd_smi.PID_METHOD


def test_the_mi300x_row_of_the_peak_table_is_the_trials_denominator(mi300x):
    _, info = mi300x
    row = next(g for g in peaks.table()["gpus"] if g["name"] == "AMD Instinct MI300X")
    for precision, dtype in (("bf16-amp", "bf16"), ("fp32", "fp32"), ("fp8", "fp8")):
        got = peak_choice.datasheet_peak(info, recipe(precision), {})
        assert got.flops_per_s == pytest.approx(row["peak_tflops"][dtype] * 1e12)
        assert got.source.startswith("AMD Instinct MI300X:")


def test_energy_of_the_measured_steps_comes_from_the_amdsmi_accumulator(mi300x):
    fake, info = mi300x
    state = SimpleNamespace(device_info=info, energy=None, round_index=0)
    window = trial_steps._EnergyWindow(state)
    window.begin()
    window.count(True), window.count(True)
    fake.energy_ticks += 65_536  # the accumulator advanced by this many ticks
    window.end()
    joules, steps, method = state.energy
    assert joules == pytest.approx(65_536 * RESOLUTION_UJ / 1e6) and steps == 2
    assert method.startswith("AMD SMI total-energy counter delta")


def test_without_amdsmi_installed_the_rocm_gpu_falls_back_to_the_host(mi300x, monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # import amdsmi -> ImportError
    monkeypatch.setattr(amd_smi, "_state", {"tried": False, "ok": False, "error": None,
                                            "lib": None})
    info = probe("cuda")
    assert not info.nvml_available and "ModuleNotFoundError" in amd_smi.unavailable_reason()
    monitor, samples = _monitor_samples(info, 1)
    assert samples[0].source == "host"


def test_the_reports_monitor_chart_draws_the_amdsmi_samples_and_names_them(mi300x):
    from engine.report.charts import monitor_chart
    from tests.engine.sample_record import make_record

    _, info = mi300x
    _, samples = _monitor_samples(info, 3)
    record = make_record()
    record.monitor_samples = samples
    record.environment = {"device": {"power_method": info.power_method}}
    chart = monitor_chart(record)
    assert chart.svg is not None
    assert chart.note.startswith("source: AMD SMI (ROCm GPU); AMD SMI socket power")


def test_a_gpu_without_the_amdsmi_energy_counter_says_so(mi300x):
    fake, info = mi300x

    def not_supported(h):  # what a virtual machine guest gets (amdsmi.h)
        raise AmdSmiLibraryException("AMDSMI_STATUS_NOT_SUPPORTED")

    fake.amdsmi_get_energy_count = not_supported
    state = SimpleNamespace(device_info=info, energy=None, round_index=0)
    trial_steps._EnergyWindow(state).begin()
    joules, _, method = state.energy
    assert joules is None
    assert method == ("this GPU or driver has no AMD SMI energy counter (amdsmi_get_energy_count "
                      "is not supported on a virtual machine guest)")
