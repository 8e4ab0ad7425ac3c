import dataclasses
import types

import pynvml
import pytest
import torch

from engine.core.config import RunConfig
from engine.measure import gpm, nvml
from engine.measure.device import DeviceInfo, probe
from engine.run.trial import run_trial

FIELDS = ("tensor_any_util_pct", "tensor_hmma_util_pct", "tensor_imma_util_pct",
          "sm_util_pct", "sm_occupancy_pct", "dram_bw_util_pct")


def ticks(step_s: float):
    """A clock that advances ``step_s`` at each reading: the GPM window's length."""
    now = [0.0]

    def clock() -> float:
        now[0] += step_s
        return now[0]
    return clock


def _gpu(cc=(9, 0), name="NVIDIA H100 80GB HBM3") -> DeviceInfo:
    return DeviceInfo("cuda", 0, name, cc, 80 * 2**30, "12.8", "570.0", True, True, True, True)


def test_cpu_trial_has_gpm_fields_na_with_the_reason():
    config = RunConfig(model="tiny", batch_size=1, seq_len=8, steps=1, warmup=0, device="cpu",
                       isolation="inline", profile_step=False)
    result = run_trial(config, "fp32", probe("cpu"), lambda _: None, lambda: False)
    assert result.status == "ok"
    g = result.gpm
    assert all(getattr(g, f) is None for f in FIELDS)
    assert g.reason.startswith("n/a: GPM needs Hopper or newer (or is not permitted)")
    assert "CPU" in g.reason


def test_pre_hopper_gpu_says_so(monkeypatch):
    monkeypatch.setattr(nvml, "available", lambda: True)
    g = gpm.GpmWindow(_gpu((8, 0), "NVIDIA A100-SXM4-80GB"))
    g.start()
    out = g.stop()
    assert all(getattr(out, f) is None for f in FIELDS)
    assert "A100" in out.reason and "8.0" in out.reason and "Hopper" in out.reason


class _FakeGpmLib:
    """pynvml's GPM surface, answering like a Hopper GPU (or refusing, when told to)."""

    c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t
    NVML_GPM_METRICS_GET_VERSION = pynvml.NVML_GPM_METRICS_GET_VERSION
    NVML_SUCCESS = pynvml.NVML_SUCCESS

    def __init__(self, supported=True, values=None, refuse=None):
        self.supported, self.values, self.refuse = supported, values or {}, refuse
        self.allocated = self.freed = 0
        for name in gpm.METRICS.values():
            setattr(self, name, getattr(pynvml, name))

    def nvmlGpmQueryDeviceSupport(self, handle):
        if self.refuse:
            raise self.refuse
        return types.SimpleNamespace(isSupportedDevice=int(self.supported))

    def nvmlGpmSampleAlloc(self):
        self.allocated += 1
        return pynvml.c_nvmlGpmSample_t()

    def nvmlGpmSampleFree(self, sample):
        self.freed += 1

    def nvmlGpmSampleGet(self, handle, sample):
        return sample

    def nvmlGpmMetricsGet(self, request):
        assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            if metric.metricId in self.values:
                metric.value = self.values[metric.metricId]
                metric.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return request


@pytest.fixture
def fake_nvml(monkeypatch):
    monkeypatch.setattr(nvml, "available", lambda: True)
    monkeypatch.setattr(nvml, "handle_for", lambda uuid, bus_id=None: object())

    def install(lib):
        monkeypatch.setattr(gpm, "_lib", lambda: lib)
        return lib

    return install


def test_hopper_metrics_are_read_between_two_samples(fake_nvml):
    values = {pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 61.5,
              pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: 60.0,
              pynvml.NVML_GPM_METRIC_SM_UTIL: 93.25,
              pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 40.0}
    lib = fake_nvml(_FakeGpmLib(values=values))
    window = gpm.GpmWindow(_gpu(), clock=ticks(0.5))
    window.start()
    out = window.stop()
    assert out.reason is None
    assert (out.tensor_any_util_pct, out.tensor_hmma_util_pct, out.sm_util_pct,
            out.dram_bw_util_pct) == (61.5, 60.0, 93.25, 40.0)
    # a metric the driver does not report stays None instead of a made-up 0
    assert out.tensor_imma_util_pct is None and out.sm_occupancy_pct is None
    assert out.window_s == 0.5 and out.na_reason is None
    assert lib.allocated == lib.freed == 2


@pytest.mark.parametrize(
    ("lib", "fragment"),
    [
        (_FakeGpmLib(supported=False), "no GPM support"),
        (_FakeGpmLib(refuse=pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)),
         "nvmlGpmQueryDeviceSupport failed"),
    ],
)
def test_refused_gpm_is_na_with_the_reason(fake_nvml, lib, fragment):
    fake_nvml(lib)
    window = gpm.GpmWindow(_gpu())
    window.start()
    out = window.stop()
    assert all(getattr(out, f) is None for f in FIELDS)
    assert out.reason.startswith(gpm.NEEDS) and fragment in out.reason


def test_gpm_text_lists_each_precision():
    ok = types.SimpleNamespace(precision="bf16-amp", gpm=dataclasses.replace(
        gpm.GpmMetrics(), tensor_any_util_pct=50.0, window_s=1.5))
    na = types.SimpleNamespace(precision="fp32", gpm=gpm.GpmMetrics(reason=gpm.NEEDS + ": CPU"))
    text = gpm.format_gpm([ok, na])
    assert "bf16-amp: tensor pipes (any) 50.0%, HMMA n/a" in text
    assert "fp32: n/a: GPM needs Hopper" in text


@pytest.mark.gpu
def test_gpm_on_this_gpu():
    info = probe("cuda")
    window = gpm.GpmWindow(info)
    window.start()
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(50):
        a @ a
    torch.cuda.synchronize()
    out = window.stop()
    if info.compute_capability >= (9, 0) and out.reason is None:
        assert out.tensor_any_util_pct is not None and out.tensor_any_util_pct > 0
    else:
        assert out.reason.startswith(gpm.NEEDS)


def test_nan_from_nvml_is_na_with_the_reason_and_the_others_are_kept(fake_nvml):
    """An H200 answered DRAM bandwidth NaN with NVML_SUCCESS for an idle window (0/0)."""
    values = {pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 0.0, pynvml.NVML_GPM_METRIC_SM_UTIL: 0.0,
              pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: float("nan")}
    fake_nvml(_FakeGpmLib(values=values))
    window = gpm.GpmWindow(_gpu(), clock=ticks(0.5))
    window.start()
    out = window.stop()
    assert out.reason is None and out.dram_bw_util_pct is None
    assert (out.tensor_any_util_pct, out.sm_util_pct) == (0.0, 0.0)
    assert out.na_reason.startswith("dram_bw_util_pct n/a: NVML returned NaN")
    text = gpm.format_gpm([types.SimpleNamespace(precision="fp32", gpm=out)])
    assert "DRAM bandwidth n/a" in text and "NaN" in text


def test_a_window_shorter_than_the_floor_is_na_with_its_length(fake_nvml):
    """The H200's fp32 trial measured 0.062 s: GPM read all zeros and a NaN."""
    values = {metric: 0.0 for metric in (pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
                                         pynvml.NVML_GPM_METRIC_SM_UTIL)}
    lib = fake_nvml(_FakeGpmLib(values=values))
    window = gpm.GpmWindow(_gpu(), clock=ticks(0.062))
    window.start()
    out = window.stop()
    assert all(getattr(out, f) is None for f in FIELDS)
    assert out.window_s == pytest.approx(0.062)
    assert "0.062 s" in out.reason and f"{gpm.MIN_WINDOW_S} s" in out.reason
    assert lib.allocated == lib.freed == 2
