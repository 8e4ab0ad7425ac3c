"""The biggest micro-batch that trains in a memory budget, per precision.

Each probe is a real trial (``engine.run.trial.run_trial``: warm-up, measured steps and the
profiled step) at one batch size, by default in its own child process so every probe
starts with clean memory and an OOM ends only that probe. The search doubles the batch
until a probe does not fit, then bisects between the last fit and the first miss.

A probe fits when the trial finished and its measured peak is within the budget. On
CUDA the budget also caps the allocator (``torch.cuda.set_per_process_memory_fraction``),
so a smaller card is emulated and an allocation past it is a real OOM; that cap binds the
allocator only, so the CUDA context (measured through NVML) is taken off it. On the CPU the
peak is the profiled step's: tensor bytes alive before the step plus the highest net
bytes the CPU allocator handed out during it.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import queue
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.core.config import ISOLATIONS, OPTIMIZERS, RunConfig, parse_precisions
from engine.core.events import TrialResult

if TYPE_CHECKING:  # engine.measure.device imports torch; the window imports this module early
    from engine.measure.device import DeviceInfo



@dataclass(frozen=True)
class Card:
    """A card as CUDA reports it: ``capacity_bytes`` is ``total_memory``, not the nominal
    size ("80 GB") it is sold by, which counts decimal gigabytes of raw memory."""

    label: str
    capacity_bytes: int
    source: str

    @property
    def header(self) -> str:
        return f"{self.label} ({self.capacity_bytes / 2**30:.1f} GiB)"


def _card(label: str, name: str) -> Card:
    """``name`` as CUDA reports it, sized from resources/peak_flops.json (its one source)."""
    from engine.measure.peaks import card_memory

    found = card_memory(name)
    return Card(label, found.memory_bytes, found.source)


CARDS = tuple(_card(label, name) for label, name in (
    ("RTX 4090", "NVIDIA GeForce RTX 4090"), ("A100 40GB", "NVIDIA A100-SXM4-40GB"),
    ("L40S", "NVIDIA L40S"), ("H100 80GB", "NVIDIA H100 80GB HBM3"), ("H200", "NVIDIA H200")))
PROBE_WARMUP, PROBE_STEPS = 1, 2
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """``"24GiB"``, ``"512 MiB"``, ``"8GB"`` or a number of bytes -> bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"memory budget '{text}' not understood: write it like 24GiB, "
                         "512MiB or 8GB (--memory-budget)")
    value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"memory budget must be above 0 (got '{text}'): "
                         "set --memory-budget, e.g. 24GiB")
    return value


@dataclass(frozen=True)
class FitConfig:
    model: str = "tiny"
    precisions: tuple[str, ...] = ("fp32",)
    seq_len: int = 128
    memory_budget_bytes: int | None = None  # None: the GPU's memory (required on the CPU)
    device: str = "auto"
    max_batch: int = 1024
    optimizer: str = "adamw"
    isolation: str = "process"
    seed: int = 0
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "precisions", parse_precisions(self.precisions))
        if self.memory_budget_bytes is not None and self.memory_budget_bytes <= 0:
            raise ValueError("memory budget must be above 0: set --memory-budget, e.g. 24GiB")
        if not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise ValueError(f"largest batch to try must be 1 or more (got {self.max_batch!r}):"
                             " set --max-batch")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer '{self.optimizer}': choose from "
                             f"{', '.join(OPTIMIZERS)}")
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"unknown isolation '{self.isolation}': choose from "
                             f"{', '.join(ISOLATIONS)}")
        self.run_config(1, self.precisions[0])  # the shared checks (seq_len, device)

    def run_config(self, batch: int, precision: str) -> RunConfig:
        return RunConfig(model=self.model, precisions=(precision,), batch_size=batch,
                         seq_len=self.seq_len, steps=PROBE_STEPS, warmup=PROBE_WARMUP,
                         optimizer=self.optimizer, device=self.device,
                         isolation=self.isolation, seed=self.seed,
                         trust_remote_code=self.trust_remote_code)


@dataclass(frozen=True)
class FitProbe:
    """One real training trial at one batch size."""

    batch_size: int
    fits: bool
    status: str  # the trial's status
    reason: str | None  # why it did not fit (or did not run)
    peak_bytes: int | None
    peak_method: str
    tokens_per_s: float | None
    predicted_bytes: int | None  # the memory model's total for this batch


@dataclass(frozen=True)
class CardFit:
    card: str  # Card.header: its label and the GiB CUDA reports
    capacity_bytes: int  # as CUDA reports it
    max_batch: int | None  # None: the line cannot say (memory did not grow with the batch)


@dataclass(frozen=True)
class FitResult:
    precision: str
    budget_bytes: int
    batch_size: int | None  # the largest batch that fit; None: not even batch 1
    reason: str | None  # why there is no batch, or that the search stopped at its bound
    memory_bytes: int | None  # measured peak at that batch
    memory_method: str
    tokens_per_s: float | None
    predicted_bytes: int | None
    probes: list[FitProbe] = field(default_factory=list)  # in the order they ran
    per_sample_bytes: float | None = None  # slope of measured peak over batch size
    fixed_bytes: float | None = None  # the line's value at batch 0
    line_batches: tuple[int, ...] = ()  # the two measured batches the line goes through
    cards: list[CardFit] = field(default_factory=list)  # a prediction, not a measurement
    cards_note: str = ""
    context_bytes: int | None = None  # the CUDA context, taken off the budget and each card
    context_method: str = "no CUDA context on the CPU"


def search(fits: Callable[[int], bool], max_batch: int) -> int | None:
    """Largest ``b`` in 1..max_batch with ``fits(b)``: doubling, then bisection.

    Assumes fitting is monotone in the batch (a bigger batch never needs less memory).
    """
    last_ok, miss, b = None, None, 1
    while b <= max_batch:
        if not fits(b):
            miss = b
            break
        last_ok, b = b, b * 2
    if last_ok is None:
        return None
    if miss is None:  # every power of two up to the bound fit
        if last_ok == max_batch or fits(max_batch):
            return max_batch
        miss = max_batch
    lo, hi = last_ok, miss
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def linear_fit(probes: list[FitProbe], cards: tuple[Card, ...] = CARDS,
               context_bytes: int | None = None
               ) -> tuple[float | None, float | None, tuple[int, ...], list[CardFit]]:
    """Per-sample slope and fixed part from the two largest fitting probes; batch per card
    in what the card leaves the allocator (its capacity less the CUDA context, if known)."""
    ok = {p.batch_size: p.peak_bytes for p in probes if p.fits and p.peak_bytes is not None}
    if len(ok) < 2:
        return None, None, (), []
    b2, b1 = sorted(ok)[-1], sorted(ok)[-2]
    slope = (ok[b2] - ok[b1]) / (b2 - b1)
    fixed = ok[b1] - slope * b1
    fits = []
    for card in cards:
        usable = card.capacity_bytes - (context_bytes or 0)
        batch = max(0, math.floor((usable - fixed) / slope)) if slope > 0 else None
        fits.append(CardFit(card.header, card.capacity_bytes, batch))
    return slope, fixed, (b1, b2), fits


def cuda_context(info: DeviceInfo) -> tuple[int | None, str]:
    """Bytes the CUDA context (and the kernels it loaded) takes outside torch's allocator,
    and how that was found: NVML's memory for this process less torch's reserved bytes."""
    if info.kind != "cuda":
        return None, "no CUDA context on the CPU"
    import os

    import torch

    from engine.measure import nvml

    handle = info.nvml_handle()
    if handle is None:
        return None, (f"not measured: NVML does not see this GPU "
                      f"({nvml.unavailable_reason() or 'no handle by UUID or PCI bus id'})")
    with info.device_context():
        torch.zeros(1, device=info.torch_device)  # this process holds a context from here
        torch.cuda.synchronize(info.torch_device)
        reserved = torch.cuda.memory_reserved(info.torch_device)
    ours = nvml.process_memory_bytes(handle, {os.getpid()})
    if ours is None:
        return None, ("not measured: NVML lists no process of ours on this GPU (a container "
                      "shows host pids)")
    return max(0, ours - reserved), ("NVML's memory for this process less torch's reserved "
                                     "bytes, read after CUDA initialised")


def _probe_result(result: TrialResult, batch: int, budget: int, kind: str) -> FitProbe:
    ps = result.profiled_step
    if kind == "cuda":
        mem = result.memory
        peak = mem.peak_allocated_bytes if mem else None
        method = "torch.cuda.max_memory_allocated over the measured steps"
    else:
        peak = ps.peak_memory_bytes if ps else None
        method = ps.peak_memory_method if ps else "not measured"
    predicted = result.predicted_memory.total_bytes if result.predicted_memory else None
    tps = result.summary.tokens_per_s if result.summary else None
    reason = result.reason
    fits = result.status == "ok" and peak is not None and peak <= budget
    if result.status == "ok" and peak is None:
        reason = f"no peak measured ({result.profiled_step_reason or 'no allocator peak'})"
    elif result.status == "ok" and not fits:
        reason = f"measured peak {peak / 2**20:.1f} MiB is over the budget"
    return FitProbe(batch, fits, result.status, None if fits else reason, peak, method, tps,
                    predicted)


class FitCancelled(Exception):
    """The search was stopped (Ctrl-C, the window closed) before it finished."""


def _probe_in_child(config: RunConfig, info: DeviceInfo, fraction: float | None,
                    out) -> None:
    import signal

    from engine.core.child import end_with_parent
    from engine.core.quiet import quiet_libraries

    end_with_parent()  # a probe never outlives fit, even one killed outright
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the search and ends us
    quiet_libraries()
    if fraction is not None:
        import torch

        torch.cuda.set_per_process_memory_fraction(fraction, info.index)
    from engine.run.trial import run_trial

    out.put(run_trial(config, config.precisions[0], info, lambda _: None, lambda: False))


def _run_probe(config: RunConfig, info: DeviceInfo, fraction: float | None,
               cancelled: Callable[[], bool]) -> TrialResult:
    precision = config.precisions[0]
    if config.isolation == "inline":
        from engine.run.trial import run_trial

        if fraction is not None:
            import torch

            torch.cuda.set_per_process_memory_fraction(fraction, info.index)
        try:
            return run_trial(config, precision, info, lambda _: None, cancelled)
        finally:
            if fraction is not None:
                torch.cuda.set_per_process_memory_fraction(1.0, info.index)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_probe_in_child, args=(config, info, fraction, out),
                        name=f"ampscope-fit-{precision}-{config.batch_size}", daemon=True)
    child.start()
    result = None
    try:
        while result is None and not cancelled():
            try:
                result = out.get(timeout=0.2)
            except queue.Empty:
                if not child.is_alive():
                    break
    finally:  # a stop (or Ctrl-C) ends the probe now: it would only measure more
        if result is None and child.is_alive():
            child.kill()
        child.join()
    if cancelled():
        raise FitCancelled
    if result is not None:
        return result
    if child.exitcode == -9:
        return TrialResult(precision, "oom", "the probe process was killed (SIGKILL), most "
                           "likely by the system's out-of-memory killer")
    return TrialResult(precision, "error", f"the probe process exited with code "
                       f"{child.exitcode} before reporting")


def budget_for(config: FitConfig, info: DeviceInfo) -> int:
    """The budget in bytes; raises ``ValueError`` when it is missing or impossible."""
    total = info.total_memory_bytes if info.kind == "cuda" else None
    if config.memory_budget_bytes is None:
        if total is None:
            raise ValueError("on the CPU the memory budget is required: set --memory-budget, "
                             "e.g. --memory-budget 4GiB")
        return int(total)
    if total is not None and config.memory_budget_bytes > total:
        raise ValueError(f"memory budget {config.memory_budget_bytes / 2**30:.1f} GiB is more "
                         f"than {info.name} has ({total / 2**30:.1f} GiB): set a smaller "
                         "--memory-budget or leave it out")
    return config.memory_budget_bytes


def _measure_context(info: DeviceInfo, out) -> None:
    out.put(cuda_context(info))


def _context_in_child(info: DeviceInfo) -> tuple[int | None, str]:
    """``cuda_context`` in a short-lived process, as each probe will have its own context:
    one made here would stay on the GPU for the whole search and shrink the probes' card."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_measure_context, args=(info, out), daemon=True,
                        name="ampscope-fit-context")
    child.start()
    try:
        return out.get(timeout=120)
    except queue.Empty:
        return None, f"not measured: the measuring process ended with code {child.exitcode}"
    finally:
        child.join(timeout=10)
        if child.is_alive():
            child.kill()


def fit_precision(config: FitConfig, precision: str, info: DeviceInfo, budget: int,
                  on_probe: Callable[[str, FitProbe], None] = lambda *_: None,
                  cancelled: Callable[[], bool] = lambda: False,
                  context: tuple[int | None, str] = (None, "no CUDA context on the CPU")
                  ) -> FitResult:
    """Search the largest batch of ``precision`` within ``budget`` bytes.

    ``context``: the CUDA context's bytes and how they were found (``cuda_context``). The
    memory-fraction cap binds the allocator only, and the context lives outside it, so
    the allocator gets the budget less the context.
    """
    context_bytes, context_method = context
    unsupported = info.unsupported_reason(precision)
    method = ("torch.cuda.max_memory_allocated over the measured steps" if info.kind == "cuda"
              else "profiled step: live tensor bytes + CPU allocator peak (torch.profiler)")
    if unsupported:
        return FitResult(precision, budget, None, unsupported, None, method, None, None,
                         context_bytes=context_bytes, context_method=context_method)
    total = info.total_memory_bytes if info.kind == "cuda" else None
    allocator_budget = budget - (context_bytes or 0)
    fraction = (allocator_budget / total if total and allocator_budget < total else None)
    probes: dict[int, FitProbe] = {}
    failure: list[str] = []

    def fits(batch: int) -> bool:
        if failure:  # an error that is not about memory ends the search
            return False
        result = _run_probe(config.run_config(batch, precision), info, fraction, cancelled)
        if cancelled():
            raise FitCancelled
        probe = _probe_result(result, batch, allocator_budget, info.kind)
        probes[batch] = probe
        on_probe(precision, probe)
        if result.status in ("error", "unsupported", "cancelled") and not _is_oom(result):
            failure.append(f"batch {batch}: {result.status}: {result.reason}")
        return probe.fits

    best = search(fits, config.max_batch)
    ordered = list(probes.values())
    slope, fixed, line, cards = linear_fit(ordered, context_bytes=context_bytes)
    note = (f"prediction, not a measurement: peak = {fixed / 2**20:.1f} MiB + "
            f"{slope / 2**20:.2f} MiB x batch, through the measured batches {line[0]} and "
            f"{line[1]}" if line else "needs two batch sizes that fit")
    if line and info.kind != "cuda":
        note += ("; measured on the CPU: a GPU also needs its CUDA context and allocator "
                 "reserve, and may use kernels with other workspaces")
    elif line:
        note += ("; torch's allocated bytes in each card's capacity as CUDA reports it"
                 + (f" less the CUDA context ({context_bytes / 2**20:.0f} MiB)"
                    if context_bytes is not None else
                    f", the CUDA context not taken off ({context_method})")
                 + "; the allocator's reserve comes on top")
    extra = dict(context_bytes=context_bytes, context_method=context_method)
    if failure:
        return FitResult(precision, budget, None, failure[0], None, method, None, None,
                         ordered, slope, fixed, line, cards, note, **extra)
    if best is None:
        first = probes.get(1)
        why = first.reason if first else "no probe ran"
        return FitResult(precision, budget, None, f"even batch 1 does not fit: {why}", None,
                         method, None, None, ordered, slope, fixed, line, cards, note, **extra)
    at = probes[best]
    reason = (f"the search stopped at its bound (--max-batch {config.max_batch}): a larger "
              "batch may fit" if best == config.max_batch else None)
    return FitResult(precision, budget, best, reason, at.peak_bytes, at.peak_method,
                     at.tokens_per_s, at.predicted_bytes, ordered, slope, fixed, line, cards,
                     note, **extra)


def _is_oom(result: TrialResult) -> bool:
    # the CPU allocator reports exhaustion as a RuntimeError, not as an OOM type
    return "can't allocate memory" in (result.reason or "")


def run_fit(config: FitConfig, on_probe: Callable[[str, FitProbe], None] = lambda *_: None,
            cancelled: Callable[[], bool] = lambda: False,
            on_result: Callable[[FitResult], None] = lambda _: None,
            ) -> tuple[int, list[FitResult]]:
    """(budget bytes, one result per precision); ``ValueError`` on bad input first,
    ``FitCancelled`` when ``cancelled()`` turns true during the search. ``on_result``
    hears each precision's result as soon as its search ends."""
    from engine.run.runner import preflight

    info = preflight(config.run_config(1, config.precisions[0]))
    budget = budget_for(config, info)
    context = (cuda_context(info) if config.isolation == "inline" or info.kind != "cuda"
               else _context_in_child(info))
    results = []
    for p in config.precisions:
        results.append(fit_precision(config, p, info, budget, on_probe, cancelled, context))
        on_result(results[-1])
    return budget, results


_UNIT_NAMES = {"": "bytes", "b": "B", "kb": "kB", "mb": "MB", "gb": "GB", "tb": "TB",
               "kib": "KiB", "mib": "MiB", "gib": "GiB", "tib": "TiB"}


def budget_text(typed: str) -> str:
    """A budget as the user wrote it, tidied: ``"32mib"`` -> ``"32 MiB"``."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", typed)
    if match is None or match.group(2).lower() not in _UNIT_NAMES:
        raise ValueError(f"memory budget '{typed}' not understood")
    return f"{match.group(1)} {_UNIT_NAMES[match.group(2).lower()]}"


def _mib(value) -> str:
    return "n/a" if value is None else f"{value / 2**20:.1f} MiB"


def format_probe(precision: str, probe: FitProbe) -> str:
    verdict = "fits" if probe.fits else f"does not fit ({probe.reason})"
    return f"  {precision} batch {probe.batch_size}: {_mib(probe.peak_bytes)}, {verdict}"


def format_fit(budget: int, results: list[FitResult]) -> str:
    """The text the ``fit`` command prints: batches found, then the per-card prediction."""
    lines = [f"memory budget {budget / 2**30:.3g} GiB ({budget:,} bytes; GiB = 2^30 bytes)"]
    context = next(iter(results), None)
    if context is not None and context.context_bytes is not None:
        lines.append(f"CUDA context {_mib(context.context_bytes)} taken off the budget "
                     f"(the memory-fraction cap binds torch's allocator only; "
                     f"{context.context_method}): the allocator gets "
                     f"{_mib(budget - context.context_bytes)}")
    elif context is not None and context.context_method.startswith("not measured"):
        lines.append(f"CUDA context not taken off the budget: {context.context_method}; "
                     "the allocator may hold the whole budget, more than a card this size "
                     "leaves it")
    lines.append(f"{'precision':<10} {'batch':>6} {'memory':>12} {'predicted':>12} "
                 f"{'tokens/s':>10}  probes (x = did not fit)")
    for r in results:
        probes = " ".join(f"{p.batch_size}{'' if p.fits else 'x'}" for p in r.probes)
        tps = f"{r.tokens_per_s:,.0f}" if r.tokens_per_s is not None else "n/a"
        batch = str(r.batch_size) if r.batch_size is not None else "n/a"
        lines.append(f"{r.precision:<10} {batch:>6} {_mib(r.memory_bytes):>12} "
                     f"{_mib(r.predicted_bytes):>12} {tps:>10}  {probes}")
        if r.reason:
            lines.append(f"  {r.precision}: {r.reason}")
    methods = {r.memory_method for r in results if r.batch_size is not None}
    lines += [f"memory: {m}" for m in methods]
    lines.append("predicted: the memory model (engine.models.memory_model) for the same batch")
    lines.append("")
    lines.append("Will it fit on ...? largest batch per card (PREDICTION from two measured "
                 "batches)")
    lines.append("cards by the capacity CUDA reports (total_memory), not their nominal GB: "
                 + "; ".join(f"{c.header}: {c.capacity_bytes:,} bytes ({c.source})"
                             for c in CARDS))
    width = max(len(c.header) for c in CARDS)
    lines.append(f"{'precision':<10} " + " ".join(f"{c.header:>{width}}" for c in CARDS))
    for r in results:
        if not r.cards:
            lines.append(f"{r.precision:<10} n/a: {r.cards_note}")
            continue
        cells = " ".join(f"{c.max_batch if c.max_batch is not None else 'n/a':>{width}}"
                         for c in r.cards)
        lines.append(f"{r.precision:<10} {cells}")
    for r in results:
        if r.cards:
            lines.append(f"  {r.precision}: {r.cards_note}")
    return "\n".join(lines)
