"""Tensor Core activity from NVML's GPU Performance Monitoring (GPM), Hopper and newer.

GPM metrics are rates between two samples: one taken when a trial's measured steps
begin, one when they end (``GpmWindow``), or the previous monitor poll's and this one's
(``GpmPoller``). The metrics say how busy the tensor pipes (any, HMMA, IMMA),
the SMs and DRAM were over that window. Where GPM cannot answer (the CPU, no NVML, a
GPU before Hopper, or a driver that does not permit it) every value is ``None`` and
``reason`` says why.
"""

from __future__ import annotations

import time

from engine.core.events import GpmMetrics
from engine.measure import amd_smi, nvml
from engine.measure.device import DeviceInfo

NEEDS = "n/a: GPM needs Hopper or newer (or is not permitted)"
# GpmMetrics field -> pynvml metric id name
METRICS = {
    "tensor_any_util_pct": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "tensor_hmma_util_pct": "NVML_GPM_METRIC_HMMA_TENSOR_UTIL",
    "tensor_imma_util_pct": "NVML_GPM_METRIC_IMMA_TENSOR_UTIL",
    "sm_util_pct": "NVML_GPM_METRIC_SM_UTIL",
    "sm_occupancy_pct": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "dram_bw_util_pct": "NVML_GPM_METRIC_DRAM_BW_UTIL",
}
WINDOW = "the trial's measured steps"


def _lib():
    import pynvml

    return pynvml


def metrics_between(first, second) -> dict[str, float | None]:
    """``METRICS`` over two GPM samples; a metric the driver does not report is ``None``."""
    lib = _lib()
    request = lib.c_nvmlGpmMetricsGet_t()
    request.version = lib.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(METRICS)
    request.sample1, request.sample2 = first, second
    for i, name in enumerate(METRICS.values()):
        request.metrics[i].metricId = getattr(lib, name)
    lib.nvmlGpmMetricsGet(request)
    return {field: (float(request.metrics[i].value)
                    if request.metrics[i].nvmlReturn == lib.NVML_SUCCESS else None)
            for i, field in enumerate(METRICS)}


def _free(sample) -> None:
    try:
        _lib().nvmlGpmSampleFree(sample)
    except Exception:  # freeing is best effort: the sample is gone either way
        pass


class GpmWindow:
    """``start()`` and ``stop()`` around a window; ``stop`` returns the metrics over it."""

    def __init__(self, info: DeviceInfo):
        self.info = info
        self._handle = None
        self._first = None
        self._started_s = None
        self.reason = self._support_reason()

    def _support_reason(self) -> str | None:
        info = self.info
        if info.kind != "cuda":
            return f"{NEEDS}: the run is on the CPU, which has no NVML GPM"
        if info.gcn_arch:
            return f"{amd_smi.NO_TENSOR_PIPES} ({info.name}, {info.gcn_arch})"
        if not nvml.available():
            return f"{NEEDS}: NVML is not available ({nvml.unavailable_reason()})"
        cc = info.compute_capability
        if cc is not None and tuple(cc) < (9, 0):
            return (f"{NEEDS}: {info.name} is compute capability {cc[0]}.{cc[1]}; GPM starts "
                    "with Hopper (9.0)")
        self._handle = info.nvml_handle()
        if self._handle is None:
            return f"{NEEDS}: NVML does not find GPU {info.index} by its UUID or PCI bus id"
        try:
            support = _lib().nvmlGpmQueryDeviceSupport(self._handle)
        except Exception as exc:  # NVMLError_NotSupported, NoPermission, an old driver
            return f"{NEEDS}: nvmlGpmQueryDeviceSupport failed: {exc}"
        if not support.isSupportedDevice:
            return f"{NEEDS}: NVML reports no GPM support on {info.name}"
        return None

    def sample(self):
        """A new GPM sample of this GPU (the caller frees it)."""
        lib = _lib()
        sample = lib.nvmlGpmSampleAlloc()
        try:
            return lib.nvmlGpmSampleGet(self._handle, sample)
        except Exception:
            lib.nvmlGpmSampleFree(sample)
            raise

    def start(self) -> None:
        if self.reason is not None:
            return
        try:
            self._first = self.sample()
            self._started_s = time.monotonic()
        except Exception as exc:
            self.reason = f"{NEEDS}: nvmlGpmSampleGet failed: {exc}"

    def stop(self) -> GpmMetrics:
        if self.reason is not None or self._first is None:
            return GpmMetrics(reason=self.reason or f"{NEEDS}: no measured step ran",
                              window=WINDOW)
        second = None
        try:
            second = self.sample()
            seconds = time.monotonic() - self._started_s
            return GpmMetrics(**metrics_between(self._first, second), window_s=seconds,
                              window=WINDOW)
        except Exception as exc:
            return GpmMetrics(reason=f"{NEEDS}: nvmlGpmMetricsGet failed: {exc}", window=WINDOW)
        finally:
            for sample in (self._first, second):
                if sample is not None:
                    _free(sample)
            self._first = None


class GpmPoller:
    """GPM for the device monitor: each ``poll`` gives the metrics since the previous one.

    A poll returns ``MonitorSample``'s ``gpm_*`` fields. The reason GPM cannot answer is
    given once, on the first poll that meets it (a run's journal holds it once, not at
    every poll); the first poll of a supported GPU has no earlier sample and gives nothing.
    """

    def __init__(self, info: DeviceInfo):
        self._window = GpmWindow(info)  # its support checks and NVML handle
        self._previous = None
        self._reported: str | None = None

    def _unavailable(self) -> dict:
        reason = self._window.reason
        if reason == self._reported:
            return {}
        self._reported = reason
        return {"gpm_reason": reason}

    def poll(self) -> dict:
        if self._window.reason is not None:
            return self._unavailable()
        try:
            current = self._window.sample()
        except Exception as exc:
            self._window.reason = f"{NEEDS}: nvmlGpmSampleGet failed: {exc}"
            self.close()
            return self._unavailable()
        previous, self._previous = self._previous, current
        if previous is None:
            return {}
        try:
            return {f"gpm_{field}": value
                    for field, value in metrics_between(previous, current).items()}
        except Exception as exc:
            self._window.reason = f"{NEEDS}: nvmlGpmMetricsGet failed: {exc}"
            self.close()
            return self._unavailable()
        finally:
            _free(previous)

    def close(self) -> None:
        """Free the sample kept for the next poll."""
        if self._previous is not None:
            _free(self._previous)
            self._previous = None


def format_gpm(trials) -> str:
    """One line per trial: tensor pipes, SM and DRAM activity over the measured steps."""
    lines = []
    for t in trials:
        g = t.gpm
        if g is None:
            continue
        if g.reason:
            lines.append(f"  {t.precision}: {g.reason}")
            continue
        cells = ", ".join(f"{label} {'n/a' if v is None else f'{v:.1f}%'}" for label, v in (
            ("tensor pipes (any)", g.tensor_any_util_pct), ("HMMA", g.tensor_hmma_util_pct),
            ("IMMA", g.tensor_imma_util_pct), ("SM active", g.sm_util_pct),
            ("SM occupancy", g.sm_occupancy_pct), ("DRAM bandwidth", g.dram_bw_util_pct)))
        lines.append(f"  {t.precision}: {cells} (over {g.window_s:.2f} s)")
    if not lines:
        return ""
    return "\n".join([f"Tensor Core activity (NVML GPM, over {WINDOW})", *lines])
