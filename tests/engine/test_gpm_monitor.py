"""The device monitor samples NVML GPM at each poll: values on Hopper, n/a with why elsewhere."""

import json
import threading
import types

import pynvml
import pytest

from engine.core.events import MonitorSample
from engine.measure import gpm, monitor, nvml
from engine.measure.device import DeviceInfo, probe
from engine.record.journal import decode, encode
from tests.engine.test_gpm import ticks

GPM_FIELDS = ("gpm_tensor_any_util_pct", "gpm_tensor_hmma_util_pct", "gpm_tensor_imma_util_pct",
              "gpm_sm_util_pct", "gpm_sm_occupancy_pct", "gpm_dram_bw_util_pct")
CYCLES = 1000  # GPU cycles between two samples of the fake
# per interval between polls: cycles the tensor pipes and the SMs were busy
TENSOR_BUSY = (100, 300, 550, 900, 20, 0, 1000, 640)
SM_BUSY = (400, 500, 600, 1000, 100, 50, 1000, 700)


def _gpu(cc, name) -> DeviceInfo:
    return DeviceInfo("cuda", 0, name, cc, 80 * 2**30, "12.8", "570.0", True, True, True, True)


class _CountingGpmLib:
    """pynvml's GPM surface over busy-cycle counters, as a Hopper GPU keeps them.

    Each sample is a snapshot of the counters; a metric is busy cycles over elapsed
    cycles between the two samples it is given, so only a poll that passes the previous
    poll's sample and its own gets the right interval's value.
    """

    NVML_GPM_METRICS_GET_VERSION = pynvml.NVML_GPM_METRICS_GET_VERSION
    NVML_SUCCESS = pynvml.NVML_SUCCESS

    def __init__(self):
        self.taken = 0
        self.tensor = self.sm = 0
        self.allocated = self.freed = 0
        for name in gpm.METRICS.values():
            setattr(self, name, getattr(pynvml, name))

    def c_nvmlGpmMetricsGet_t(self):
        return types.SimpleNamespace(metrics=[types.SimpleNamespace() for _ in gpm.METRICS])

    def nvmlGpmQueryDeviceSupport(self, handle):
        return types.SimpleNamespace(isSupportedDevice=1)

    def nvmlGpmSampleAlloc(self):
        self.allocated += 1
        return types.SimpleNamespace()

    def nvmlGpmSampleFree(self, sample):
        self.freed += 1

    def nvmlGpmSampleGet(self, handle, sample):
        if self.taken:  # the interval that ends with this sample
            i = (self.taken - 1) % len(TENSOR_BUSY)
            self.tensor += TENSOR_BUSY[i]
            self.sm += SM_BUSY[i]
        sample.cycles, sample.tensor, sample.sm = self.taken * CYCLES, self.tensor, self.sm
        self.taken += 1
        return sample

    def nvmlGpmMetricsGet(self, request):
        assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        a, b = request.sample1, request.sample2
        busy = {pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: b.tensor - a.tensor,
                pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: b.tensor - a.tensor,
                pynvml.NVML_GPM_METRIC_SM_UTIL: b.sm - a.sm}
        for metric in request.metrics[:request.numMetrics]:
            if metric.metricId in busy:
                metric.value = 100.0 * busy[metric.metricId] / (b.cycles - a.cycles)
                metric.nvmlReturn = pynvml.NVML_SUCCESS
            else:  # IMMA, occupancy, DRAM: this driver does not report them
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return request


class _QuietTracker:
    """NvmlTracker's shape without NVML: the GPM fields are the ones under test."""

    source = "nvml"

    def __init__(self, handle):
        pass

    def start(self):
        pass

    def sample(self):
        return {}

    def stop(self):
        pass


def _collect(mon_for, count: int) -> list[MonitorSample]:
    """Run the monitor thread until it has emitted ``count`` samples."""
    samples, enough = [], threading.Event()

    def emit(sample):
        samples.append(sample)
        if len(samples) >= count:
            enough.set()

    mon = mon_for(emit)
    mon.start()
    assert enough.wait(60), "the monitor thread stopped emitting"
    mon.stop()
    return samples


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(nvml, "available", lambda: True)
    monkeypatch.setattr(nvml, "handle_for", lambda uuid, bus_id=None: object())
    monkeypatch.setattr(monitor, "NvmlTracker", _QuietTracker)
    lib = _CountingGpmLib()
    monkeypatch.setattr(gpm, "_lib", lambda: lib)
    return lib


def test_hopper_monitor_samples_carry_gpm_since_the_previous_poll(fake_gpu):
    info = _gpu((9, 0), "NVIDIA H100 80GB HBM3")
    # each poll reads a clock 0.25 s on: every window is over GPM's floor
    samples = _collect(lambda emit: monitor.Monitor(
        _QuietTracker(None), emit, 200, gpm.GpmPoller(info, clock=ticks(0.25))), 6)
    # the first poll has no earlier sample: nothing measured, and nothing is n/a either
    assert all(getattr(samples[0], f) is None for f in GPM_FIELDS)
    assert all(s.gpm_reason is None for s in samples)
    for i, s in enumerate(samples[1:]):
        assert s.gpm_tensor_any_util_pct == pytest.approx(TENSOR_BUSY[i] / CYCLES * 100)
        assert s.gpm_tensor_hmma_util_pct == pytest.approx(TENSOR_BUSY[i] / CYCLES * 100)
        assert s.gpm_sm_util_pct == pytest.approx(SM_BUSY[i] / CYCLES * 100)
        # metrics the driver does not report stay None rather than a made-up 0
        assert s.gpm_tensor_imma_util_pct is None and s.gpm_dram_bw_util_pct is None
        assert s.gpm_sm_occupancy_pct is None
    # every sample taken is freed once the monitor stops (NVML memory is not leaked)
    assert fake_gpu.allocated == fake_gpu.freed == fake_gpu.taken


def test_pre_hopper_monitor_gives_the_reason_once(fake_gpu):
    info = _gpu((8, 0), "NVIDIA A100-SXM4-80GB")
    samples = _collect(lambda emit: monitor.Monitor.for_device(info, emit, hz=200), 4)
    assert all(getattr(s, f) is None for s in samples for f in GPM_FIELDS)
    reason = samples[0].gpm_reason
    assert reason.startswith(gpm.NEEDS) and "A100" in reason and "8.0" in reason
    assert all(s.gpm_reason is None for s in samples[1:])  # once per run, not every poll
    assert fake_gpu.taken == 0


def test_cpu_monitor_gives_the_reason_once():
    samples = _collect(lambda emit: monitor.Monitor.for_device(probe("cpu"), emit, hz=200), 3)
    assert samples[0].source == "host"
    assert all(getattr(s, f) is None for s in samples for f in GPM_FIELDS)
    assert samples[0].gpm_reason.startswith(gpm.NEEDS) and "CPU" in samples[0].gpm_reason
    assert all(s.gpm_reason is None for s in samples[1:])


def test_gpm_refused_mid_run_is_reported_and_no_sample_is_leaked(fake_gpu):
    poller = gpm.GpmPoller(_gpu((9, 0), "NVIDIA H100 80GB HBM3"), clock=ticks(0.25))
    assert poller.poll() == {}
    assert poller.poll()["gpm_tensor_any_util_pct"] == pytest.approx(10.0)

    def refuse(handle, sample):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)

    fake_gpu.nvmlGpmSampleGet = refuse
    reason = poller.poll()["gpm_reason"]
    assert reason.startswith(gpm.NEEDS) and "nvmlGpmSampleGet failed" in reason
    assert poller.poll() == {}  # said once
    assert fake_gpu.allocated == fake_gpu.freed


def test_journal_keeps_gpm_fields_and_reads_samples_without_them():
    sample = MonitorSample(time_s=2.0, source="nvml", gpu_util_pct=90.0,
                           gpm_tensor_any_util_pct=61.5, gpm_sm_util_pct=93.25,
                           gpm_dram_bw_util_pct=40.0)
    line = json.loads(json.dumps(encode(sample)))
    assert decode(line, {}) == sample
    assert "gpm_tensor_any_util_pct" not in line  # short keys, as the other monitor fields
    na = MonitorSample(time_s=1.0, source="host", gpm_reason=gpm.NEEDS + ": the CPU")
    assert decode(json.loads(json.dumps(encode(na))), {}) == na
    old = decode({"e": "mon", "t": 1.0, "src": "nvml", "gu": 50.0}, {})
    assert old.gpm_tensor_any_util_pct is None and old.gpm_reason is None


def test_polls_closer_than_the_floor_extend_the_window(fake_gpu):
    """Polls 0.125 s apart: GPM answers every other poll, over 0.25 s."""
    poller = gpm.GpmPoller(_gpu((9, 0), "NVIDIA H100 80GB HBM3"), clock=ticks(0.125))
    answers = [poller.poll() for _ in range(5)]
    assert answers[0] == {} and answers[1] == {} and answers[3] == {}
    # the fake's counters move once per sample taken: the values are its first two windows'
    assert answers[2]["gpm_tensor_any_util_pct"] == pytest.approx(TENSOR_BUSY[0] / CYCLES * 100)
    assert answers[4]["gpm_tensor_any_util_pct"] == pytest.approx(TENSOR_BUSY[1] / CYCLES * 100)
    assert fake_gpu.taken == 3  # no sample is taken for a poll inside the floor
    poller.close()
    assert fake_gpu.allocated == fake_gpu.freed


def test_nan_in_a_poll_is_none_and_explained_once(fake_gpu):
    real = fake_gpu.nvmlGpmMetricsGet

    def idle_dram(request):
        real(request)
        dram = list(gpm.METRICS).index("dram_bw_util_pct")
        request.metrics[dram].value = float("nan")
        request.metrics[dram].nvmlReturn = pynvml.NVML_SUCCESS
        return request

    fake_gpu.nvmlGpmMetricsGet = idle_dram
    poller = gpm.GpmPoller(_gpu((9, 0), "NVIDIA H100 80GB HBM3"), clock=ticks(0.25))
    polls = [poller.poll() for _ in range(4)]
    assert all(p["gpm_dram_bw_util_pct"] is None for p in polls[1:])
    assert polls[1]["gpm_reason"].startswith("gpm_dram_bw_util_pct n/a: NVML returned NaN")
    assert "gpm_reason" not in polls[2] and "gpm_reason" not in polls[3]
    assert polls[2]["gpm_tensor_any_util_pct"] is not None  # the other metrics are kept
    poller.close()


@pytest.mark.gpu
def test_monitor_gpm_on_this_gpu():
    import torch

    info = probe("cuda")
    samples = []
    mon = monitor.Monitor.for_device(info, samples.append, hz=10)
    mon.start()
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(400):
        a @ a
    torch.cuda.synchronize()
    mon.stop()
    if info.compute_capability >= (9, 0) and samples[0].gpm_reason is None:
        assert max(s.gpm_tensor_any_util_pct or 0.0 for s in samples) > 0
    else:
        assert samples[0].gpm_reason.startswith(gpm.NEEDS)
