"""Tensor Core activity from NVML's GPU Performance Monitoring (GPM), Hopper and newer.

GPM metrics are rates between two samples: one taken when a trial's measured steps
begin, one when they end (``GpmWindow``), or the previous monitor poll's and this one's
(``GpmPoller``). The metrics say how busy the tensor pipes (any, HMMA, IMMA),
the SMs and DRAM were over that window. Where GPM cannot answer (the CPU, no NVML, a
GPU before Hopper, or a driver that does not permit it) every value is ``None`` and
``reason`` says why.

Two answers of NVML's are no measurement, found on an H200: a metric over a window in which
the GPU did no work comes back as NaN with a success code (0/0; DRAM bandwidth did), and a
window shorter than NVML's GPM refresh (the docs ask for samples over 100 ms apart) gives
all zeros. A NaN metric is ``None`` with the reason; a window shorter than
``MIN_WINDOW_S`` is n/a (the trial's) or extended to the next poll (the monitor's).
"""

from __future__ import annotations

import math
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
MIN_WINDOW_S = 0.2  # twice NVML's GPM refresh (about 100 ms): a shorter window reads zeros
NAN_REASON = ("n/a: NVML returned NaN with success for this window (0/0: the GPU did no "
              "such work in it)")


def short_window_reason(seconds: float) -> str:
    return (f"n/a: {WINDOW} took {seconds:.3f} s, under the {MIN_WINDOW_S} s GPM needs "
            "(NVML refreshes its GPM counters about every 100 ms; a shorter window reads "
            "zeros or NaN): measure more steps")


def _lib():
    import pynvml

    return pynvml


def metrics_between(first, second) -> tuple[dict[str, float | None], list[str]]:
    """``METRICS`` over two GPM samples, and the fields NVML answered NaN (or infinity)
    for; a metric the driver does not report, or answers so, is ``None``."""
    lib = _lib()
    request = lib.c_nvmlGpmMetricsGet_t()
    request.version = lib.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(METRICS)
    request.sample1, request.sample2 = first, second
    for i, name in enumerate(METRICS.values()):
        request.metrics[i].metricId = getattr(lib, name)
    lib.nvmlGpmMetricsGet(request)
    values, nonfinite = {}, []
    for i, field in enumerate(METRICS):
        metric = request.metrics[i]
        value = float(metric.value) if metric.nvmlReturn == lib.NVML_SUCCESS else None
        if value is not None and not math.isfinite(value):
            value = None
            nonfinite.append(field)
        values[field] = value
    return values, nonfinite


def _free(sample) -> None:
    try:
        _lib().nvmlGpmSampleFree(sample)
    except Exception:  # freeing is best effort: the sample is gone either way
        pass


class GpmWindow:
    """``start()`` and ``stop()`` around a window; ``stop`` returns the metrics over it."""

    def __init__(self, info: DeviceInfo, clock=time.monotonic):
        self.info = info
        self.clock = clock
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
            self._started_s = self.clock()
        except Exception as exc:
            self.reason = f"{NEEDS}: nvmlGpmSampleGet failed: {exc}"

    def stop(self) -> GpmMetrics:
        if self.reason is not None or self._first is None:
            return GpmMetrics(reason=self.reason or f"{NEEDS}: no measured step ran",
                              window=WINDOW)
        second = None
        try:
            second = self.sample()
            seconds = self.clock() - self._started_s
            if seconds < MIN_WINDOW_S:
                return GpmMetrics(window_s=seconds, window=WINDOW,
                                  reason=short_window_reason(seconds))
            values, nonfinite = metrics_between(self._first, second)
            return GpmMetrics(**values, window_s=seconds, window=WINDOW,
                              na_reason=", ".join(nonfinite) + f" {NAN_REASON}"
                              if nonfinite else None)
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

    def __init__(self, info: DeviceInfo, clock=time.monotonic):
        self._window = GpmWindow(info, clock)  # its support checks and NVML handle
        self._previous = None
        self._previous_s = 0.0
        self._reported: str | None = None
        self._nan_said: set[str] = set()  # fields whose NaN was explained once

    def _unavailable(self) -> dict:
        reason = self._window.reason
        if reason == self._reported:
            return {}
        self._reported = reason
        return {"gpm_reason": reason}

    def poll(self) -> dict:
        if self._window.reason is not None:
            return self._unavailable()
        now = self._window.clock()
        if self._previous is not None and now - self._previous_s < MIN_WINDOW_S:
            return {}  # too short a window: the next poll's covers this one too
        try:
            current = self._window.sample()
        except Exception as exc:
            self._window.reason = f"{NEEDS}: nvmlGpmSampleGet failed: {exc}"
            self.close()
            return self._unavailable()
        previous, self._previous, self._previous_s = self._previous, current, now
        if previous is None:
            return {}
        try:
            values, nonfinite = metrics_between(previous, current)
            out = {f"gpm_{field}": value for field, value in values.items()}
            unsaid = [f"gpm_{f}" for f in nonfinite if f not in self._nan_said]
            if unsaid:  # said once per field: an idle GPU answers NaN at every poll
                self._nan_said.update(nonfinite)
                out["gpm_reason"] = f"{', '.join(unsaid)} {NAN_REASON}"
            return out
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
        lines.append(f"  {t.precision}: {cells} (over {g.window_s:.2f} s)"
                     + (f"; {g.na_reason}" if g.na_reason else ""))
    if not lines:
        return ""
    return "\n".join([f"Tensor Core activity (NVML GPM, over {WINDOW})", *lines])
