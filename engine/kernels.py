"""What ran on the hardware during one extra, unmeasured training step.

The step runs under ``torch.profiler`` (CPU, plus CUDA on a GPU) with input shapes
and memory recorded. Each aten op's self time is grouped by the dtype of its inputs
(the profiler records them for the very call) and by a category: matmul,
elementwise/normalisation, copy/cast, optimizer, GradScaler. On a GPU the time is the
kernels' device time, kernels are classified as Tensor Core or not from their names,
and the gaps between kernels are the device's idle time.

The analysis works on plain ``OpCall``/``DeviceSpan`` records so the CUDA logic is
testable without a GPU.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

import torch

from engine.events import GemmShapeTime, KernelTime, OpTime, ProfiledStep

STEP_RANGE = "ampscope:step"
_RANGE_PREFIXES = ("ampscope:", "Optimizer.", "ProfilerStep", "autograd::")
SCALER_RANGE = "ampscope:grad_scaler"
GRAD_NORM_RANGE = "ampscope:grad_norm"

MATMUL, ELEMENTWISE, COPY, OPTIMIZER, SCALER, GRAD_NORM, OTHER = (
    "matmul", "elementwise/normalisation", "copy/cast", "optimizer", "GradScaler",
    "grad norm", "other",
)
CATEGORIES = (MATMUL, ELEMENTWISE, COPY, OPTIMIZER, SCALER, GRAD_NORM, OTHER)
# CPU only: step time in no aten op (Python, the autograd engine, the profiler itself)
OUTSIDE_OPS = "outside aten ops"

_MATMUL_OPS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_mm", "_int_mm",
               "addmv", "mv", "dot", "einsum", "convolution", "_convolution", "conv1d",
               "conv2d", "scaled_dot_product_attention"}
_MATMUL_PREFIXES = ("_scaled_dot_product_", "_flash_attention", "_efficient_attention",
                    "cudnn_convolution", "mkldnn_convolution", "_cudnn_attention")
_COPY_OPS = {"copy_", "_to_copy", "to", "clone", "contiguous", "cat", "stack", "_copy_from",
             "_copy_from_and_resize"}
_NORM_WORDS = ("norm", "softmax")

# profiler dtype names (c10 scalar type names) -> torch's names
_DTYPE_NAMES = {
    "float": "float32", "double": "float64", "c10::Half": "float16",
    "c10::BFloat16": "bfloat16", "c10::Float8_e4m3fn": "float8_e4m3fn",
    "c10::Float8_e5m2": "float8_e5m2", "signed char": "int8", "unsigned char": "uint8",
    "long int": "int64", "int": "int32", "short int": "int16", "bool": "bool",
}
_FLOATING = ("float32", "float64", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")

# Kernel names that run on Tensor Cores: MMA instruction families (HMMA/IMMA, Hopper's
# wgmma, Blackwell's tcgen05), cuBLAS's Hopper GEMM family nvjet (warpgroup MMA), tile
# names such as s16816, or a GEMM/xmma/cutlass/attention kernel whose name carries a
# half, 8-bit or TF32 input type ("xmma_gemm_f32f32_f32f32" is plain fp32: not TC).
# SIMT templates and gemv kernels do not. A name is the only evidence a trace has.
_TENSOR_CORE = re.compile(
    r"wgmma|hmma|imma|tcgen05|nvjet|tensorop|s16816|s1688|h16816|h1688|i16832|i8816|"
    r"(gemm|xmma|cutlass|flash|fmha).*(f16|bf16|fp16|half|e4m3|e5m2|tf32|i8)|"
    r"(f16|bf16|fp16|half|e4m3|e5m2|tf32).*(gemm|cutlass)", re.IGNORECASE)
_NOT_TENSOR_CORE = re.compile(r"simt|gemv|dot_kernel|sgemm(?!.*tf32)|dgemm", re.IGNORECASE)
_MATMUL_KERNEL = re.compile(r"gemm|xmma|wgmma|nvjet|cutlass|matmul|fmha|flash|attention",
                            re.IGNORECASE)


@dataclass(frozen=True)
class OpCall:
    """One aten op call from the profiler, reduced to what the analysis needs."""

    name: str  # "aten::addmm"
    ancestors: tuple[str, ...]  # names of enclosing ranges/ops, innermost first
    input_dtypes: tuple[str, ...]  # profiler names ("float", "c10::Half", "Scalar", ...)
    self_cpu_us: float
    kernels: tuple[tuple[str, float], ...] = ()  # (kernel name, device us) launched by it
    shapes: tuple[tuple[int, ...], ...] = ()  # input shapes (matmuls only)


@dataclass(frozen=True)
class DeviceSpan:
    """One kernel, memcpy or memset on the GPU timeline."""

    start_us: float
    end_us: float


def op_dtype(input_dtypes: tuple[str, ...]) -> str:
    """The op's dtype: its first floating input, else its first tensor input, else "-"."""
    names = [_DTYPE_NAMES[d] for d in input_dtypes if d in _DTYPE_NAMES]
    floating = [d for d in names if d in _FLOATING]
    return (floating or names or ["-"])[0]


@cache
def _pointwise(short: str) -> bool:
    packet = getattr(torch.ops.aten, short, None)
    if packet is None:
        return False
    try:
        return any(torch.Tag.pointwise in getattr(packet, o).tags for o in packet.overloads())
    except (AttributeError, RuntimeError):
        return False


_GEMM_LEAVES = {"mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "_int_mm"}


def odd_gemm(call: OpCall, dtype: str) -> tuple[int, int, int, int] | None:
    """(M, N, K, multiple) of a GEMM call whose M, N or K is not a multiple of 8 (16 for
    fp8), the alignment Tensor Core kernels need to run at full speed; else None.
    The same rule as the numerics lab's flagged GEMMs."""
    short = call.name.removeprefix("aten::")
    if short not in _GEMM_LEAVES:
        return None
    args = call.shapes[1:] if short in ("addmm", "baddbmm") else call.shapes  # skip the bias
    mats = [s for s in args if len(s) >= 2]
    if len(mats) < 2:
        return None
    a, b = mats[0], mats[1]
    m, n, k = a[-2], b[-1], a[-1]
    multiple = 16 if dtype.startswith("float8") else 8
    if m % multiple or n % multiple or k % multiple:
        return m, n, k, multiple
    return None


def _odd_reason(m: int, n: int, k: int, multiple: int) -> str:
    odd = [f"{label}={v}" for label, v in zip("MNK", (m, n, k)) if v % multiple]
    return (f"{', '.join(odd)} not a multiple of {multiple}: Tensor Cores need padding or a "
            "slower kernel")


def category(call: OpCall) -> str:
    """The op's category; the innermost optimizer/GradScaler/grad-norm range wins."""
    for name in call.ancestors:
        if name.startswith("Optimizer.step") or name.startswith("Optimizer.zero_grad"):
            return OPTIMIZER
        if name == SCALER_RANGE:
            return SCALER
        if name == GRAD_NORM_RANGE:
            return GRAD_NORM
    short = call.name.removeprefix("aten::")
    if _is_matmul(call.name):
        return MATMUL
    if short in _COPY_OPS:
        return COPY
    if any(word in short for word in _NORM_WORDS) or _pointwise(short):
        return ELEMENTWISE
    return OTHER


def tensor_core_kernel(name: str) -> bool:
    """True when a matmul kernel's name says it ran on Tensor Cores."""
    if _NOT_TENSOR_CORE.search(name):
        return False
    return bool(_TENSOR_CORE.search(name))


def idle_gaps_us(spans: list[DeviceSpan]) -> tuple[float, float]:
    """(span from first start to last end, time in it with nothing running) in us."""
    if not spans:
        return 0.0, 0.0
    ordered = sorted(spans, key=lambda s: s.start_us)
    first, busy_end, idle = ordered[0].start_us, ordered[0].end_us, 0.0
    for s in ordered[1:]:
        if s.start_us > busy_end:
            idle += s.start_us - busy_end
        busy_end = max(busy_end, s.end_us)
    return busy_end - first, idle


@dataclass
class _Acc:
    calls: int = 0
    us: float = 0.0
    extra: dict = field(default_factory=dict)


def analyse(calls: list[OpCall], device_kind: str, step_wall_us: float,
            spans: list[DeviceSpan] | None = None) -> ProfiledStep:
    """Group the step's op (CPU) or kernel (GPU) time by op, dtype and category."""
    gpu = device_kind == "cuda"
    ops: dict[tuple[str, str, str], _Acc] = {}
    kernels: dict[tuple[str, str, str], _Acc] = {}
    odd: dict[tuple, _Acc] = {}
    for call in calls:
        cat, dtype = category(call), op_dtype(call.input_dtypes)
        us = sum(d for _, d in call.kernels) if gpu else call.self_cpu_us
        acc = ops.setdefault((call.name, dtype, cat), _Acc())
        acc.calls += 1
        acc.us += us
        dims = odd_gemm(call, dtype) if cat == MATMUL else None
        if dims is not None:
            o = odd.setdefault((call.name, dtype, *dims), _Acc(extra={"tc": True}))
            o.calls += 1
            o.us += us
            if gpu:
                o.extra["tc"] = o.extra["tc"] and all(tensor_core_kernel(k) for k, _ in
                                                      call.kernels)
        for kname, dur in call.kernels if gpu else ():
            k = kernels.setdefault((kname, call.name, dtype), _Acc())
            k.calls += 1
            k.us += dur
            k.extra["matmul"] = cat == MATMUL or bool(_MATMUL_KERNEL.search(kname))
    if gpu:
        step_us, idle_us = idle_gaps_us(spans or [])
        idle_reason = None if spans else "no kernel ran in the profiled step"
    else:
        step_us, idle_us = step_wall_us, None
        idle_reason = ("CPU run: ops run back to back on the host thread, there is no "
                       "separate device timeline with gaps between kernels")
    share = (lambda us: us / step_us) if step_us > 0 else (lambda us: None)
    by_cat = dict.fromkeys(CATEGORIES, 0.0)
    by_mm_dtype: dict[str, float] = {}
    for (_, dtype, cat), acc in ops.items():
        by_cat[cat] += acc.us
        if cat == MATMUL:
            by_mm_dtype[dtype] = by_mm_dtype.get(dtype, 0.0) + acc.us
    if not gpu:
        by_cat[OUTSIDE_OPS] = max(0.0, step_us - sum(by_cat.values()))
    rows = sorted(ops.items(), key=lambda kv: -kv[1].us)
    op_rows = [OpTime(op=name, dtype=dtype, category=cat, calls=a.calls, self_ms=a.us / 1e3,
                      step_share=share(a.us)) for (name, dtype, cat), a in rows if a.us > 0]
    kernel_rows = [
        KernelTime(name=kname, op=op, dtype=dtype, calls=a.calls, ms=a.us / 1e3,
                   tensor_core=tensor_core_kernel(kname) if a.extra["matmul"] else None)
        for (kname, op, dtype), a in sorted(kernels.items(), key=lambda kv: -kv[1].us)
    ]
    odd_rows = [
        GemmShapeTime(op=name, dtype=dtype, m=m, n=n, k=k, calls=a.calls, ms=a.us / 1e3,
                      tensor_core=a.extra["tc"] if gpu else None,
                      reason=_odd_reason(m, n, k, mult))
        for (name, dtype, m, n, k, mult), a in sorted(odd.items(), key=lambda kv: -kv[1].us)
    ]
    tc_share, tc_reason = None, ("CPU run: no Tensor Cores" if not gpu else None)
    if gpu:
        mm = [k for k in kernel_rows if k.tensor_core is not None]
        mm_ms = sum(k.ms for k in mm)
        if mm_ms > 0:
            tc_share = sum(k.ms for k in mm if k.tensor_core) / mm_ms
        else:
            tc_reason = "no matmul kernel ran in the profiled step"
    return ProfiledStep(
        time_basis=("device time of the kernels each aten op launched (torch.profiler, CUDA "
                    "activity); step = first kernel start to last kernel end") if gpu else
                   ("self CPU time of each aten op (torch.profiler); step = wall time of "
                    "the profiled step"),
        step_ms=step_us / 1e3,
        category_ms={k: v / 1e3 for k, v in by_cat.items()},
        category_share={k: share(v) for k, v in by_cat.items()},
        matmul_share_by_dtype={k: share(v) for k, v in sorted(by_mm_dtype.items())},
        ops=op_rows,
        kernels=kernel_rows,
        idle_gap_ms=idle_us / 1e3 if idle_us is not None else None,
        idle_gap_share=share(idle_us) if idle_us is not None else None,
        idle_gap_reason=idle_reason,
        tensor_core_share=tc_share,
        tensor_core_reason=tc_reason,
        odd_gemms=odd_rows,
        dtype_method="input dtypes the profiler recorded for each call (record_shapes); "
                     "the op's dtype is its first floating-point input; a matmul that calls "
                     "another (linear, or autocast's outer call before the cast) takes the "
                     "dtype of the innermost one",
    )


def _ancestors(event) -> tuple[str, ...]:
    names, parent = [], event.cpu_parent
    while parent is not None:
        names.append(parent.name)
        parent = parent.cpu_parent
    return tuple(names)


def _is_matmul(name: str) -> bool:
    short = name.removeprefix("aten::")
    return short in _MATMUL_OPS or short.startswith(_MATMUL_PREFIXES)


def _work_dtypes(event) -> tuple[str, ...]:
    """Input dtypes of the GEMM that did the work.

    A matmul that calls another one (``linear`` -> ``addmm``, or autocast's outer call of
    ``addmm`` before its cast -> the inner ``addmm``) recorded its inputs before the cast;
    the innermost matmul below it has the dtype that ran.
    """
    if not _is_matmul(event.name):
        return tuple(event.input_dtypes or ())
    found, pending = event, list(event.cpu_children)
    while pending:
        child = pending.pop(0)
        if _is_matmul(child.name):
            found, pending = child, list(child.cpu_children)
        else:
            pending.extend(child.cpu_children)
    return tuple(found.input_dtypes or ())


def _calls_from(events) -> tuple[list[OpCall], float, list[DeviceSpan]]:
    from torch.autograd import DeviceType

    calls, spans, step_us = [], [], 0.0
    for e in events:
        if e.device_type == DeviceType.CPU:
            if e.name == STEP_RANGE:
                step_us = e.time_range.elapsed_us()
            elif e.name.startswith("aten::"):
                calls.append(OpCall(
                    name=e.name, ancestors=_ancestors(e),
                    input_dtypes=_work_dtypes(e), self_cpu_us=e.self_cpu_time_total,
                    kernels=tuple((k.name, float(k.duration)) for k in e.kernels),
                    shapes=_shapes(e) if _is_matmul(e.name) else (),
                ))
        elif e.device_type == DeviceType.CUDA and _device_work(e):
            spans.append(DeviceSpan(e.time_range.start, e.time_range.end))
    return calls, step_us, spans


def _shapes(event) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(d) for d in shape) for shape in (event.input_shapes or ())
                 if isinstance(shape, list | tuple) and all(isinstance(d, int) for d in shape))


def _device_work(event) -> bool:
    """A kernel, memcpy or memset: not a range mirrored onto the GPU timeline (the GPU
    user annotations of record_function) and not a zero-length memory record."""
    if getattr(event, "is_user_annotation", False) or event.name.startswith(_RANGE_PREFIXES):
        return False
    return event.time_range.elapsed_us() > 0 and not event.name.startswith("[")


def live_tensor_bytes(*trees) -> int:
    """Bytes of the distinct storages behind the tensors in ``trees`` (dicts, lists, tensors)."""
    from torch.utils._pytree import tree_leaves

    seen: dict[int, int] = {}
    for t in tree_leaves(list(trees)):
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _cpu_allocator_peak(prof) -> int:
    """Highest net bytes the CPU allocator handed out during the profile (memory events)."""
    from torch.autograd import DeviceType

    net = peak = 0
    for k in prof.profiler.kineto_results.events():
        if k.name() == "[memory]" and k.device_type() == DeviceType.CPU:
            net += k.nbytes()
            peak = max(peak, net)
    return peak


def profile_step(step: Callable[[], None], device: torch.device, live_bytes: int,
                 trace_file: str | None = None,
                 memory_snapshot_file: str | None = None) -> ProfiledStep:
    """Run ``step`` once under the profiler and analyse it; optional trace and snapshot.

    ``live_bytes``: tensor bytes alive before the step (parameters, buffers, quantisation
    state, optimizer state, batches), the base of the CPU memory peak.
    """
    import dataclasses

    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    snapshot = cuda and memory_snapshot_file is not None
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    if snapshot:
        torch.cuda.memory._record_memory_history(max_entries=200_000)
    try:
        with profile(activities=activities, record_shapes=True, profile_memory=True) as prof:
            with record_function(STEP_RANGE):
                step()
            if cuda:
                torch.cuda.synchronize(device)
        if snapshot:
            torch.cuda.memory._dump_snapshot(memory_snapshot_file)
    finally:
        if snapshot:
            torch.cuda.memory._record_memory_history(enabled=None)
    calls, step_us, spans = _calls_from(prof.events())
    result = analyse(calls, device.type, step_us, spans)
    if cuda:
        peak = int(torch.cuda.max_memory_allocated(device))
        method = "torch.cuda.max_memory_allocated over the profiled step"
    else:
        peak = live_bytes + _cpu_allocator_peak(prof)
        method = ("tensor bytes alive before the step (parameters, buffers, quantisation "
                  "state, optimizer state, batches) + the highest net bytes the CPU "
                  "allocator handed out during the step (torch.profiler memory events)")
    if trace_file:
        prof.export_chrome_trace(trace_file)
    return dataclasses.replace(
        result, peak_memory_bytes=peak, peak_memory_method=method, trace_file=trace_file,
        memory_snapshot_file=memory_snapshot_file if snapshot else None,
    )


def _pct(share: float | None) -> str:
    if share is None:
        return "n/a"
    return "<0.1%" if 0 < share < 0.001 else f"{100 * share:.1f}%"


def format_profiled(trials) -> str:
    """Per precision: where the profiled step's time went (the ``profile`` command's text)."""
    rows = [t for t in trials if t.profiled_step is not None or t.status == "ok"]
    if not rows:
        return ""
    cols = {ELEMENTWISE: "elem/norm", COPY: "copy/cast", OPTIMIZER: "optimizer",
            SCALER: "GradScaler"}
    lines = ["Time in one extra profiled step per precision (never a measured step)",
             f"{'precision':<10} {'step':>10}  {'matmul by dtype':<28} "
             + " ".join(f"{h:>10}" for h in cols.values()) + f" {'idle gaps':>10} {'on TC':>7}"]
    notes: dict[str, None] = {}
    odd_lines: list[str] = []
    for t in rows:
        ps = t.profiled_step
        if ps is None:
            lines.append(f"{t.precision:<10} n/a: "
                         f"{t.profiled_step_reason or 'this kind of trial has no profiled step'}")
            continue
        mm = ", ".join(f"{_pct(v)} {k}" for k, v in ps.matmul_share_by_dtype.items()) or "none"
        lines.append(f"{t.precision:<10} {ps.step_ms:>7.1f} ms  {mm:<28} "
                     + " ".join(f"{_pct(ps.category_share.get(c)):>10}" for c in cols)
                     + f" {_pct(ps.idle_gap_share):>10} {_pct(ps.tensor_core_share):>7}")
        if ps.odd_gemms:
            ms = sum(g.ms for g in ps.odd_gemms)
            top = ps.odd_gemms[0]
            tc = {True: ", all on Tensor Cores", False: ", some off Tensor Cores"}.get(
                all(g.tensor_core for g in ps.odd_gemms)
                if all(g.tensor_core is not None for g in ps.odd_gemms) else None, "")
            odd_lines.append(f"  {t.precision}: {len(ps.odd_gemms)} GEMM shapes off the Tensor "
                             f"Core multiple, {_pct(ms / ps.step_ms if ps.step_ms else None)} "
                             f"of the step{tc}; most time: {top.op} {top.m}x{top.n}x{top.k} "
                             f"{top.dtype} ({top.reason})")
        for reason in (ps.idle_gap_reason and f"idle gaps n/a: {ps.idle_gap_reason}",
                       ps.tensor_core_reason and f"on TC (Tensor Core share of matmul time) "
                                                 f"n/a: {ps.tensor_core_reason}",
                       f"time: {ps.time_basis}"):
            if reason:
                notes[reason] = None
    lines += odd_lines
    lines += [f"  {n}" for n in notes]
    return "\n".join(lines)
