"""The achievable matmul peak of the device in use, measured, cached per machine.

A datasheet peak is what the silicon could do at its boost clock; what a square matmul
of the library's best kernel reaches on this machine (its clocks, power cap, cooling,
torch build, thread count) is a second denominator for MFU, and the only one on a CPU.
Each dtype of the peak table this benchmark can run gets a short time-boxed loop of
square matmuls in ``nn.Linear``'s layout (``x @ W.T``); its best call is the measured peak.

Results are cached in the user cache folder (``platformdirs``, or ``$AMPSCOPE_CACHE_DIR``)
keyed by the device's name and torch's version (and, on the CPU, torch's thread count,
which scales the result), so a run measures once per machine and reuses it;
``forget`` drops the entry so that the next run measures again (``--measure-peak``).
"""

from __future__ import annotations

import os
import textwrap
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from engine.core.cache_dir import cache_dir, read_entries, write_entries
from engine.measure.peaks import PeakLookup, over_peak

CACHE_FILE = "matmul_peak.json"
LABEL = "MFU vs measured matmul peak"
DATASHEET_LABEL = "MFU vs datasheet peak"
COMMON_LABEL = "MFU vs common 16-bit peak"  # engine.measure.peaks.COMMON_CONVENTION
# square sizes per device kind: a GPU's kernels reach their plateau near 8192; on a CPU
# without bf16 units (torch emulates bf16/fp16 at ~1 GFLOP/s) 256 keeps it short. The size
# doubles from SMALLEST while one call takes under a tenth of the budget, so a slow dtype
# (or a slow device) stops at the size it can time in its budget
SIZE = {"cuda": 8192, "cpu": 256}
SMALLEST = 256
BUDGET_S = {"cuda": 0.2, "cpu": 0.1}  # timed loop per dtype, after one warm-up call
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")  # the peak-table columns timed here
# passes over the dtypes; each dtype keeps its best: a burst of load slows one pass, not all
TRIES = 3


@dataclass(frozen=True)
class MeasuredPeak:
    """One machine's measured matmul rates, TFLOP/s by peak-table column."""

    key: str
    device: str
    torch_version: str
    sizes: dict  # column -> the square size its best call multiplied
    measured_at_s: float
    tflops: dict = field(default_factory=dict)  # column -> TFLOP/s
    reasons: dict = field(default_factory=dict)  # column -> why it was not measured
    failed: list = field(default_factory=list)  # columns whose matmul raised (out of memory)
    # the host's 1-minute load average and core count when it was taken (None: older entries)
    load_avg_1m: float | None = None
    cpu_count: int | None = None
    # why it was measured again: a run beat it (None: the first measurement, or on request)
    remeasured_because: str | None = None
    # column -> why its rate is the earlier measurement's (measuring it again failed)
    kept: dict = field(default_factory=dict)

    def lookup(self, dtype: str) -> PeakLookup:
        """This dtype's measured rate as a peak MFU can divide by, or the reason."""
        rate = self.tflops.get(dtype)
        if rate:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.measured_at_s))
            kept = f"; {self.kept[dtype]}" if dtype in self.kept else ""
            return PeakLookup(rate * 1e12, (
                f"measured matmul peak: {rate:.4g} TFLOP/s {dtype}, best {self.sizes[dtype]}x"
                f"{self.sizes[dtype]} matmul of {TRIES} passes on {self.device} (torch "
                f"{self.torch_version}, measured {when}{self.load_text()}{kept}; main.py "
                "profile --measure-peak, or Measure again in the window's status bar, "
                "measures again)"), None)
        why = self.reasons.get(dtype) or f"the matmul benchmark does not time {dtype}"
        return PeakLookup(None, None, f"no measured {dtype} matmul peak: {why}")


    def load_text(self) -> str:
        """The load it was taken under, as a phrase ("" for an older entry)."""
        if self.load_avg_1m is None:
            return ""
        busy = (" (busy: the peak may be low)" if self.cpu_count
                and self.load_avg_1m > self.cpu_count else "")
        again = f"; measured again: {self.remeasured_because}" if self.remeasured_because else ""
        return (f", under a load average of {self.load_avg_1m:.2f} on {self.cpu_count} "
                f"cores{busy}{again}")


def beaten_by(steps) -> bool:
    """Whether any measured step ran faster than the measured peak allows."""
    return any(not s.warmup and over_peak(s.mfu_measured) for s in steps)


def remeasure(info, why: str) -> MeasuredPeak:
    """Measure again because a run beat the cached peak; each dtype keeps the best of the
    old and the new measurement (a peak can only have been measured too low). A dtype whose
    new matmul failed (out of memory beside the trial's model) keeps its old rate, and says
    so: dropping it would leave the trial without a measured peak."""
    old = cached(info)
    new = measure(info)
    if old is not None:
        best = {d: max(r, old.tflops.get(d) or 0.0) for d, r in new.tflops.items()}
        sizes = {d: new.sizes[d] if r == new.tflops[d] else old.sizes.get(d, new.sizes[d])
                 for d, r in best.items()}
        kept = {d: f"measuring it again failed ({new.reasons[d]}): its rate is the earlier "
                   "measurement's" for d in new.failed if old.tflops.get(d)}
        for d in kept:
            best[d], sizes[d] = old.tflops[d], old.sizes[d]
        new = MeasuredPeak(**{**asdict(new), "tflops": best, "sizes": sizes, "kept": kept,
                              "reasons": {d: r for d, r in new.reasons.items() if d not in kept},
                              "failed": [d for d in new.failed if d not in kept]})
    new = MeasuredPeak(**{**asdict(new), "remeasured_because": why})
    if not new.failed:
        entries = _read()
        entries[new.key] = asdict(new)
        _write(entries)
    return new


def cache_path() -> Path:
    return cache_dir() / CACHE_FILE


def cache_key(device_name: str, kind: str) -> str:
    threads = f" | {torch.get_num_threads()} threads" if kind == "cpu" else ""
    return f"{device_name} | torch {torch.__version__}{threads}"


def _read() -> dict:
    return read_entries(cache_path())


def _write(entries: dict) -> None:
    write_entries(cache_path(), entries)


def cached(info) -> MeasuredPeak | None:
    """The cached measurement of ``info``'s device, or ``None``."""
    entry = _read().get(cache_key(info.name, info.kind))
    try:
        return MeasuredPeak(**entry) if isinstance(entry, dict) else None
    except TypeError:  # an entry of another shape: measure again
        return None


def forget(info) -> bool:
    """Drop the cached measurement of ``info``'s device; True if there was one."""
    entries = _read()
    if entries.pop(cache_key(info.name, info.kind), None) is None:
        return False
    _write(entries)
    return True


def for_device(info, rerun: bool = False,
               on_dtype: Callable[[str], None] | None = None) -> MeasuredPeak:
    """The device's measured peak: the cached one, else (or with ``rerun``) measured now;
    ``on_dtype`` hears each dtype as its timing starts (the window's progress)."""
    found = None if rerun else cached(info)
    if found is not None:
        return found
    measured = measure(info, on_dtype)
    if not measured.failed:  # a failure may pass (memory another process held): not kept
        entries = _read()
        entries[measured.key] = asdict(measured)
        _write(entries)
    return measured


def _fp8_dtype(info) -> torch.dtype:
    """The fp8 flavour the device's matrix units take (FNUZ on MI300, gfx942)."""
    return torch.float8_e4m3fnuz if getattr(info, "gcn_arch", None) == "gfx942" \
        else torch.float8_e4m3fn


def _matmul(info, dtype: str, n: int, device: torch.device) -> Callable[[], object] | str:
    """A no-argument call doing one n x n x n matmul in ``dtype``, or why it cannot."""
    if dtype == "tf32" and not info.tf32_supported:
        return ("TF32 is a matmul mode of NVIDIA Ampere+ (and AMD gfx94x+) GPUs; this "
                "device multiplies fp32 in fp32")
    if dtype == "fp8":
        fp8 = _fp8_dtype(info)
        a = torch.randn(n, n, device=device).to(fp8)
        b = torch.randn(n, n, device=device).to(fp8).t()  # _scaled_mm wants B column-major
        one = torch.ones((), device=device)
        try:
            torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)
        except torch.OutOfMemoryError:
            raise  # not the device's answer: the caller keeps no cache of it
        except Exception as exc:  # no fp8 GEMM here (a GPU before Ada, an old build)
            return f"torch._scaled_mm does not run on this device ({type(exc).__name__})"
        return lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)
    torch_dtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
                   "fp16": torch.float16}[dtype]
    a = torch.randn(n, n, device=device, dtype=torch_dtype)
    w = torch.randn(n, n, device=device, dtype=torch_dtype)
    # x @ W.T, as nn.Linear multiplies: on a CPU without bf16 units torch's bf16 kernel for
    # that layout is ~10x faster than for a plain row-major B, and the model runs this one
    return lambda: torch.mm(a, w.t())


def _sized(info, dtype: str, device: torch.device, budget_s: float
           ) -> tuple[int, Callable[[], object] | str]:
    """The dtype's call at the largest size up to ``SIZE`` whose single call (after a
    warm-up one) takes under a tenth of the budget, with that size."""
    n = min(SMALLEST, SIZE[info.kind])
    while True:
        call = _matmul(info, dtype, n, device)
        if isinstance(call, str) or n >= SIZE[info.kind]:
            return n, call
        call()  # warm-up: the first call of a shape picks its kernel
        if _synced_s(call, device) * 10 > budget_s:
            return n, call
        n *= 2


def _synced_s(call: Callable[[], object], device: torch.device) -> float:
    """One call's seconds on the host clock, the device's queue drained on both sides."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def _best_call_s(call: Callable[[], object], device: torch.device, budget_s: float) -> float:
    """The fastest call's seconds in a loop of ``budget_s`` after one warm-up call."""
    call()
    best, start = float("inf"), time.perf_counter()
    if device.type == "cuda":  # events on the stream: one call is too short for the host clock
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        while time.perf_counter() - start < budget_s:
            begin.record()
            call()
            end.record()
            end.synchronize()
            best = min(best, begin.elapsed_time(end) / 1e3)
        return best
    while time.perf_counter() - start < budget_s or best == float("inf"):
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(info, on_dtype: Callable[[str], None] | None = None) -> MeasuredPeak:
    """Time square matmuls in each of ``DTYPES`` on ``info``'s device (a second or two)."""
    device = info.torch_device
    budget = BUDGET_S[info.kind]
    tflops, reasons, failed, sizes = {}, {}, [], {}
    cublas = torch.backends.cuda.matmul
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    with info.device_context():
        for attempt in range(TRIES):
            for dtype in DTYPES:
                if dtype in reasons:  # cannot run (or failed) here: not tried again
                    continue
                if on_dtype is not None and attempt == 0:
                    on_dtype(dtype)
                before = cublas.fp32_precision
                if info.kind == "cuda":  # cuBLAS's fp32 mode: TF32 for the tf32 column only
                    cublas.fp32_precision = "tf32" if dtype == "tf32" else "ieee"
                try:
                    n, call = _sized(info, dtype, device, budget)
                    if isinstance(call, str):
                        reasons[dtype] = call
                        continue
                    rate = 2 * n**3 / _best_call_s(call, device, budget) / 1e12
                    if rate > tflops.get(dtype, 0.0):
                        tflops[dtype], sizes[dtype] = rate, n
                except Exception as exc:  # out of memory, a dtype the build lacks
                    reasons[dtype] = f"the {dtype} matmul failed: {type(exc).__name__}: {exc}"
                    tflops.pop(dtype, None)
                    sizes.pop(dtype, None)
                    failed.append(dtype)
                finally:
                    cublas.fp32_precision = before
        if info.kind == "cuda":
            torch.cuda.empty_cache()  # the trial's memory starts without the benchmark's
    return MeasuredPeak(key=cache_key(info.name, info.kind), device=info.name,
                        torch_version=torch.__version__, sizes=sizes, measured_at_s=time.time(),
                        tflops=tflops, reasons=reasons, failed=failed, load_avg_1m=load,
                        cpu_count=os.cpu_count())


def format_mfu(trials, width: int = 120) -> str:
    """The CLI's MFU table: each trial's MFU against both peaks, each named, with the
    reasons for an n/a wrapped below (each reason once)."""
    rows, reasons = [], {}

    def cell(value, peak, reason, label) -> str:
        if value is None:
            reasons.setdefault(f"{label} n/a: {reason or 'not measured'}", None)
            return "n/a"
        return f"{value:.1%} of {peak / 1e12:.4g} TFLOP/s"

    for t in trials:
        s = t.summary
        if s is None or t.status != "ok":
            continue
        rows.append((t.precision,
                     cell(s.mfu_common, s.common_peak_flops, s.mfu_common_reason, COMMON_LABEL),
                     cell(s.mfu, s.peak_flops, s.mfu_reason, DATASHEET_LABEL),
                     cell(s.mfu_measured, s.measured_peak_flops, s.mfu_measured_reason, LABEL)))
    if not rows:
        return ""
    headers = ("MFU (model FLOPs)", "vs common 16-bit peak", "vs datasheet peak",
               "vs measured matmul peak")
    widths = [max(len(r[i]) for r in (headers, *rows)) for i in range(len(headers))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in (headers, *rows)]
    for reason in reasons:
        lines += textwrap.wrap(reason, width, initial_indent="  ", subsequent_indent="    ")
    return "\n".join(lines)
