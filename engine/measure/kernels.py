"""What ran on the hardware during one extra, unmeasured training step.

The step runs under ``torch.profiler`` (CPU, plus CUDA on a GPU) with input shapes
and memory recorded. Each aten op's self time is grouped by the dtype of its inputs
(the profiler records them for the very call) and by a category: matmul,
elementwise/normalisation, copy/cast, optimizer, GradScaler. On a GPU the time is the
kernels' device time, kernels are classified as Tensor Core or not from their names,
and the gaps between kernels are the device's idle time.

Here: running the profiler (``profile_step``), reading its events or a Chrome trace into
the plain ``OpCall``/``DeviceSpan`` records of engine/measure/op_calls.py (so the CUDA logic
is testable without a GPU), the analysis by op, dtype and category (``analyse``) and its
text. What a kernel's name says is engine/measure/kernel_names.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

import torch

from engine.core.events import GemmShapeTime, KernelTime, OpTime, ProfiledStep
from engine.measure.kernel_names import MATMUL_KINDS, KernelClass, classify_kernel
from engine.measure.kernel_workspace import workspace_line
from engine.measure.op_calls import (
    DeviceSpan,
    OpCall,
    idle_gaps_us,
    is_matmul,
    odd_gemm,
    odd_reason,
    op_dtype,
)
from engine.measure.padding import padding_hint
from engine.measure.trace_read import CPU_CATS, DEVICE_CATS, RUNTIME_CATS

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
# GPU only: kernels whose launch no CPU op enclosed (only the step range, or nothing)
UNATTRIBUTED = "unattributed"
# ranges that are not an op: a kernel launched directly under them has no enclosing op
_NOT_OPS = (STEP_RANGE, "ProfilerStep#")
_KIND_CATEGORY = {"matmul": MATMUL, "attention": MATMUL, "matmul helper": MATMUL,
                  "elementwise": ELEMENTWISE, "reduction/normalisation": ELEMENTWISE,
                  "foreach/optimizer": OPTIMIZER, "copy": COPY, "quantisation": COPY}

_COPY_OPS = {"copy_", "_to_copy", "to", "clone", "contiguous", "cat", "stack", "_copy_from",
             "_copy_from_and_resize"}
_NORM_WORDS = ("norm", "softmax")


@cache
def _pointwise(short: str) -> bool:
    packet = getattr(torch.ops.aten, short, None)
    if packet is None:
        return False
    try:
        return any(torch.Tag.pointwise in getattr(packet, o).tags for o in packet.overloads())
    except (AttributeError, RuntimeError):
        return False


def category(call: OpCall) -> str:
    """The op's category; the innermost optimizer/GradScaler/grad-norm range wins (the
    op itself may be such a range when a kernel was launched directly under it)."""
    for name in (call.name, *call.ancestors):
        if name.startswith("Optimizer.step") or name.startswith("Optimizer.zero_grad"):
            return OPTIMIZER
        if name == SCALER_RANGE:
            return SCALER
        if name == GRAD_NORM_RANGE:
            return GRAD_NORM
    short = call.name.removeprefix("aten::")
    if is_matmul(call.name):
        return MATMUL
    if short in _COPY_OPS:
        return COPY
    if any(word in short for word in _NORM_WORDS) or _pointwise(short):
        return ELEMENTWISE
    return OTHER


@dataclass
class _Acc:
    calls: int = 0
    us: float = 0.0
    extra: dict = field(default_factory=dict)


def _kernel_category(call: OpCall, cat: str, kclass: KernelClass) -> str:
    """An aten op's or a range's category holds for all its kernels; under another op
    (inductor's Triton ranges, bitsandbytes' ops, a compiled graph) the kernel's kind
    decides."""
    if call.name.startswith("aten::") or cat != OTHER:
        return cat
    return _KIND_CATEGORY.get(kclass.kind, OTHER)


def analyse(calls: list[OpCall], device_kind: str, step_wall_us: float,
            spans: list[DeviceSpan] | None = None) -> ProfiledStep:
    """Group the step's op (CPU) or kernel (GPU) time by op, dtype and category.

    On a GPU every kernel counts once: under the op that enclosed its launch, or in the
    unattributed bucket; the category shares and the idle-gap share sum to 1.
    """
    gpu = device_kind == "cuda"
    ops: dict[tuple[str, str, str], _Acc] = {}
    kernels: dict[tuple[str, str, str], _Acc] = {}
    odd: dict[tuple, _Acc] = {}
    spans = spans or []

    def add_kernel(kname: str, op: str, dtype: str, dur: float) -> None:
        k = kernels.setdefault((kname, op, dtype), _Acc())
        k.calls += 1
        k.us += dur

    for call in calls:
        cat, dtype = category(call), op_dtype(call.input_dtypes)
        if gpu:
            by_cat: dict[str, float] = {}
            for kname, dur in call.kernels:
                kcat = _kernel_category(call, cat, classify_kernel(kname))
                by_cat[kcat] = by_cat.get(kcat, 0.0) + dur
                add_kernel(kname, call.name, dtype, dur)
        else:
            by_cat = {cat: call.self_cpu_us}
        for c, us in (by_cat or {cat: 0.0}).items():
            acc = ops.setdefault((call.name, dtype, c), _Acc())
            acc.calls += 1
            acc.us += us
        dims = odd_gemm(call, dtype) if cat == MATMUL else None
        if dims is not None:
            o = odd.setdefault((call.name, dtype, *dims), _Acc(extra={"tc": True}))
            o.calls += 1
            o.us += sum(by_cat.values())
            if gpu:
                o.extra["tc"] = o.extra["tc"] and all(
                    classify_kernel(k).tensor_core is not False for k, _ in call.kernels)
    unattributed_us = 0.0
    for s in spans:
        if not s.attributed:
            unattributed_us += s.end_us - s.start_us
            add_kernel(s.name, UNATTRIBUTED, "-", s.end_us - s.start_us)
    if gpu:
        span_us, idle_us = idle_gaps_us(spans)
        idle_reason = None if spans else "no kernel ran in the profiled step"
    else:
        span_us, idle_us = step_wall_us, None
        idle_reason = ("CPU run: ops run back to back on the host thread, there is no "
                       "separate device timeline with gaps between kernels")
    by_cat = dict.fromkeys(CATEGORIES, 0.0)
    by_mm_dtype: dict[str, float] = {}
    for (_, dtype, cat), acc in ops.items():
        by_cat[cat] += acc.us
        if cat == MATMUL:  # an op that recorded no input dtype (a Triton template range)
            key = "unknown" if dtype == "-" else dtype
            by_mm_dtype[key] = by_mm_dtype.get(key, 0.0) + acc.us
    if gpu:
        by_cat[UNATTRIBUTED] = unattributed_us
        # kernels on several streams may overlap: the shares are of the summed kernel
        # time plus the idle gaps, which equals the span when they do not
        total_us = sum(by_cat.values()) + idle_us
    else:
        by_cat[OUTSIDE_OPS] = max(0.0, span_us - sum(by_cat.values()))
        total_us = span_us
    share = (lambda us: us / total_us) if total_us > 0 else (lambda us: None)
    rows = sorted(ops.items(), key=lambda kv: -kv[1].us)
    op_rows = [OpTime(op=name, dtype=dtype, category=cat, calls=a.calls, self_ms=a.us / 1e3,
                      step_share=share(a.us)) for (name, dtype, cat), a in rows if a.us > 0]
    kernel_rows = []
    for (kname, op, dtype), a in sorted(kernels.items(), key=lambda kv: -kv[1].us):
        kc = classify_kernel(kname)
        kernel_rows.append(KernelTime(name=kname, op=op, dtype=dtype, calls=a.calls,
                                      ms=a.us / 1e3, tensor_core=kc.tensor_core, kind=kc.kind,
                                      tensor_core_why=kc.why))
    odd_rows = [
        GemmShapeTime(op=name, dtype=dtype, m=m, n=n, k=k, calls=a.calls, ms=a.us / 1e3,
                      tensor_core=a.extra["tc"] if gpu else None,
                      reason=odd_reason(m, n, k, mult))
        for (name, dtype, m, n, k, mult), a in sorted(odd.items(), key=lambda kv: -kv[1].us)
    ]
    tc_share, tc_reason = None, ("CPU run: no Tensor Cores" if not gpu else None)
    if gpu:
        mm = [k for k in kernel_rows if k.kind in MATMUL_KINDS]
        judged = [k for k in mm if k.tensor_core is not None]
        judged_ms = sum(k.ms for k in judged)
        unknown_ms = sum(k.ms for k in mm) - judged_ms
        if judged_ms > 0:
            tc_share = sum(k.ms for k in judged if k.tensor_core) / judged_ms
        if unknown_ms > 0:
            tc_reason = (f"{unknown_ms:.3f} ms of matmul kernels left out: their names do "
                         "not say whether they ran on Tensor Cores (e.g. Triton templates)")
        elif not mm:
            tc_reason = "no matmul kernel ran in the profiled step"
    return ProfiledStep(
        time_basis=("device time of the kernels each op launched (torch.profiler, CUDA "
                    "activity; a kernel counts under the innermost CPU op of any namespace "
                    "that enclosed its launch, else as unattributed); step = first kernel "
                    "start to last kernel end; shares are of the kernels' summed time plus "
                    "the idle gaps (the step, unless kernels overlapped)") if gpu else
                   ("self CPU time of each aten op (torch.profiler); step = wall time of "
                    "the profiled step"),
        step_ms=span_us / 1e3,
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


def kineto_dtypes(prof) -> dict[int, list[str]]:
    """Each CPU op's input dtypes by its correlation id (a ``FunctionEvent``'s ``id``), from
    the profiler's own records (``_KinetoEvent.dtypes``): where torch's ``FunctionEvent``
    has no ``input_dtypes`` (torch 2.11) the records still hold them. Empty where those
    records have no ``dtypes`` either."""
    from torch.autograd import DeviceType

    events = prof.profiler.kineto_results.events()
    return {k.correlation_id(): list(k.dtypes()) for k in events
            if hasattr(k, "dtypes") and k.device_type() == DeviceType.CPU}


def recorded_dtypes(prof, events) -> dict[int, list[str]] | None:
    """What ``_calls_from`` needs beside ``events`` to know each op's input dtypes: None
    where every event has ``input_dtypes``, else the profiler's records (torch 2.11)."""
    return None if all(hasattr(e, "input_dtypes") for e in events) else kineto_dtypes(prof)


def _input_dtypes(event, dtypes_by_id: dict[int, list[str]] | None) -> tuple[str, ...]:
    """The dtypes the profiler recorded for an op's inputs: its ``input_dtypes`` where the
    event has that attribute, else the profiler's records by the event's id."""
    if hasattr(event, "input_dtypes"):
        return tuple(event.input_dtypes or ())
    return tuple((dtypes_by_id or {}).get(event.id) or ())


def _work_dtypes(event, dtypes_by_id: dict[int, list[str]] | None = None) -> tuple[str, ...]:
    """Input dtypes of the GEMM that did the work.

    A matmul that calls another one (``linear`` -> ``addmm``, or autocast's outer call of
    ``addmm`` before its cast -> the inner ``addmm``) recorded its inputs before the cast;
    the innermost matmul below it has the dtype that ran.
    """
    if not is_matmul(event.name):
        return _input_dtypes(event, dtypes_by_id)
    found, pending = event, list(event.cpu_children)
    while pending:
        child = pending.pop(0)
        if is_matmul(child.name):
            found, pending = child, list(child.cpu_children)
        else:
            pending.extend(child.cpu_children)
    return _input_dtypes(found, dtypes_by_id)


def _attributed(device: list, owners: set[int], calls: list[OpCall]) -> list[bool]:
    """Whether an op (not only the step range, not nothing) enclosed each kernel's launch.

    The profiler hangs a kernel on the CPU event its launch links to (the innermost op or
    range around it). Where the device event names that event (``linked_correlation_id``)
    the link decides; where it does not (torch 2.11's ``FunctionEvent``), the ops' own
    kernel lists do: a kernel is attributed while an op holds one of its name and
    duration (a match up to which of two identical kernels it was, so every time is the
    same)."""
    if all(hasattr(e, "linked_correlation_id") for e in device):
        linked = owners - {0}  # once: built per kernel, it made a long trace quadratic
        return [e.linked_correlation_id in linked for e in device]
    held = Counter((name, round(us, 3)) for c in calls for name, us in c.kernels)
    found = []
    for e in device:
        key = (e.name, round(e.time_range.end - e.time_range.start, 3))
        found.append(held[key] > 0)
        held[key] -= 1
    return found


def _is_op(event) -> bool:
    """A CPU event that can own time: an aten op, or any other op or range (inductor's
    Triton ranges, bitsandbytes' ops, a compiled graph) that launched kernels itself."""
    if event.name.startswith("aten::"):
        return True
    return bool(event.kernels) and not event.name.startswith(_NOT_OPS)


def _calls_from(events, dtypes_by_id: dict[int, list[str]] | None = None,
                ) -> tuple[list[OpCall], float, list[DeviceSpan]]:
    """OpCalls, the step's wall time and the device spans, from torch.profiler's
    ``FunctionEvent``s or the same built from a Chrome trace (``chrome_trace_events``).
    ``dtypes_by_id`` (``kineto_dtypes``) stands in for events without ``input_dtypes``."""
    from torch.autograd import DeviceType

    calls, device, owners, step_us = [], [], set(), 0.0
    for e in events:
        if e.device_type == DeviceType.CPU:
            if e.name == STEP_RANGE:
                step_us = e.time_range.elapsed_us()
            elif _is_op(e):
                owners.add(e.id)
                calls.append(OpCall(
                    name=e.name, ancestors=_ancestors(e),
                    input_dtypes=_work_dtypes(e, dtypes_by_id),
                    self_cpu_us=e.self_cpu_time_total,
                    kernels=tuple((k.name, float(k.duration)) for k in e.kernels),
                    shapes=_shapes(e) if is_matmul(e.name) else (),
                ))
        elif e.device_type == DeviceType.CUDA and _device_work(e):
            device.append(e)
    spans = [DeviceSpan(e.time_range.start, e.time_range.end, e.name, attributed=linked)
             for e, linked in zip(device, _attributed(device, owners, calls), strict=True)]
    return calls, step_us, spans


@dataclass(frozen=True)
class _Interval:
    start: float
    end: float

    def elapsed_us(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class _Kernel:
    name: str
    duration: float


@dataclass(eq=False)
class TraceEvent:
    """One event of a Chrome trace with the ``FunctionEvent`` attributes the analysis
    reads, so a trace file is analysed exactly as a live profile is."""

    name: str
    device_type: object
    id: int
    time_range: _Interval
    input_dtypes: list = field(default_factory=list)
    input_shapes: list = field(default_factory=list)
    linked_correlation_id: int = 0
    is_user_annotation: bool = False
    cpu_parent: TraceEvent | None = None
    cpu_children: list = field(default_factory=list)
    kernels: list = field(default_factory=list)

    @property
    def self_cpu_time_total(self) -> float:
        return self.time_range.elapsed_us() - sum(c.time_range.elapsed_us()
                                                   for c in self.cpu_children)




def chrome_trace_events(path: str) -> list[TraceEvent]:
    """The events of a Kineto/Chrome trace (``export_chrome_trace``) as the analysis
    needs them: CPU ops nested by time on each thread, and each kernel hung on its CPU
    op. A kernel's op is the CPU event with its "External id"; failing that, the
    innermost CPU event on the launching thread that contains its runtime launch (found
    by "correlation"); failing that, none (unattributed)."""
    import json

    with open(path, encoding="utf-8") as f:
        return trace_events_of(json.load(f))


def trace_events_of(raw) -> list[TraceEvent]:
    """``chrome_trace_events`` of a trace already parsed (``{"traceEvents": [...]}`` or the
    bare list)."""
    from torch.autograd import DeviceType

    items = raw["traceEvents"] if isinstance(raw, dict) else raw
    complete = [e for e in items if e.get("ph") == "X" and "dur" in e]
    cpu: list[TraceEvent] = []
    threads: dict[tuple, list[TraceEvent]] = {}
    by_external: dict[int, TraceEvent] = {}
    for e in complete:
        if e.get("cat") not in CPU_CATS:
            continue
        args = e.get("args", {})
        # its own id (len + 1): "External id" may be missing or shared by ranges
        ev = TraceEvent(e["name"], DeviceType.CPU, len(cpu) + 1,
                        _Interval(float(e["ts"]), float(e["ts"]) + float(e["dur"])),
                        input_dtypes=list(args.get("Input type", [])),
                        input_shapes=list(args.get("Input Dims", [])),
                        is_user_annotation=e.get("cat") == "user_annotation")
        cpu.append(ev)
        threads.setdefault((e.get("pid"), e.get("tid")), []).append(ev)
        external = int(args.get("External id", 0) or 0)
        if external:
            by_external.setdefault(external, ev)
    for evs in threads.values():  # nest by time: a parent starts first and lasts longest
        evs.sort(key=lambda ev: (ev.time_range.start, -ev.time_range.end))
        stack: list[TraceEvent] = []
        for ev in evs:
            while stack and stack[-1].time_range.end < ev.time_range.end:
                stack.pop()
            if stack:
                ev.cpu_parent = stack[-1]
                stack[-1].cpu_children.append(ev)
            stack.append(ev)
    launches = {e["args"]["correlation"]: e for e in complete
                if e.get("cat") in RUNTIME_CATS and "correlation" in e.get("args", {})}
    device: list[TraceEvent] = []
    owners: list[TraceEvent | None] = []
    for e in complete:
        if e.get("cat") not in DEVICE_CATS:
            continue
        args = e.get("args", {})
        owner = by_external.get(int(args.get("External id", 0) or 0))
        launch = launches.get(args.get("correlation"))
        if owner is None and launch is not None:
            owner = _innermost(threads.get((launch.get("pid"), launch.get("tid")), []),
                               float(launch["ts"]))
        start = float(e["ts"])
        device.append(TraceEvent(e["name"], DeviceType.CUDA, 0,
                                 _Interval(start, start + float(e["dur"]))))
        owners.append(owner)
        if owner is not None:
            owner.kernels.append(_Kernel(e["name"], float(e["dur"])))
    merged = _merge_repeated(cpu)
    for ev, owner in zip(device, owners, strict=True):
        while owner in merged:
            owner = merged[owner]
        ev.linked_correlation_id = owner.id if owner is not None else 0
    return [ev for ev in cpu if ev not in merged] + device


def _merge_repeated(cpu: list[TraceEvent]) -> dict[TraceEvent, TraceEvent]:
    """Fold an op into its parent of the same name when it is the parent's only child
    (``aten::div_`` redispatching to ``aten::div_``), as torch.profiler's event list does
    (``EventList._remove_dup_nodes``); the parent takes its children and kernels.
    Returns folded event -> the parent it went into."""
    merged: dict[TraceEvent, TraceEvent] = {}
    for ev in sorted(cpu, key=lambda e: (e.time_range.start, -e.time_range.end)):
        parent = ev.cpu_parent
        if parent is not None and parent.name == ev.name and len(parent.cpu_children) == 1:
            parent.cpu_children = ev.cpu_children
            parent.kernels.extend(ev.kernels)
            for child in ev.cpu_children:
                child.cpu_parent = parent
            merged[ev] = parent
    return merged


def analyse_trace_file(path: str, device_kind: str) -> ProfiledStep:
    """The analysis of one profiled step's Chrome trace (``export_chrome_trace``), as
    ``profile_step`` makes it for a step written with ``--trace``."""
    calls, step_us, spans = _calls_from(chrome_trace_events(path))
    return analyse(calls, device_kind, step_us, spans)


def _innermost(events: list[TraceEvent], ts: float) -> TraceEvent | None:
    """The innermost of ``events`` (one thread's, nested) whose time contains ``ts``."""
    found = None
    for ev in events:
        if ev.time_range.start <= ts <= ev.time_range.end and (
                found is None or ev.time_range.elapsed_us() <= found.time_range.elapsed_us()):
            found = ev
    return found


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

    from engine.measure.memtrack import storages

    seen: dict[int, int] = {}
    for t in tree_leaves(list(trees)):
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            # a wrapper subclass (torchao's low-bit optimiser state) by its inner storages
            for storage in storages(t):
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


# a GPU's timed profile, in steps (only the active one is read): the profiler's start-up
# (CUPTI's) falls in the first two, and recording shapes there would stretch the kernels'
# gaps. On the CPU the step that records shapes and memory is the timed one: its step time
# and category shares were within the spread of a step profiled with neither (tiny preset,
# fp32 and bf16 autocast, 4 alternating pairs each), and an emulated half step takes half a
# second there.
PROFILE_SCHEDULE = {"wait": 1, "warmup": 1, "active": 1}


def _join_shapes(timed: list[OpCall], shaped: list[OpCall]) -> list[OpCall]:
    """The timed step's calls with the input dtypes and shapes of the same calls in the
    shapes step (the k-th call of an op in one is the k-th in the other: a training step
    runs the same ops in the same order)."""
    import dataclasses

    seen: dict[str, int] = {}
    by_name: dict[str, list[OpCall]] = {}
    for call in shaped:
        by_name.setdefault(call.name, []).append(call)
    joined = []
    for call in timed:
        k = seen.get(call.name, 0)
        seen[call.name] = k + 1
        twins = by_name.get(call.name, [])
        if k < len(twins) and not call.input_dtypes:
            call = dataclasses.replace(call, input_dtypes=twins[k].input_dtypes,
                                       shapes=twins[k].shapes)
        joined.append(call)
    return joined


def profile_step(step: Callable[[], None], device: torch.device, live_bytes: int,
                 trace_file: str | None = None,
                 memory_snapshot_file: str | None = None) -> ProfiledStep:
    """Profile ``step`` as lightly as still attributes kernels, and analyse it.

    On a GPU, untimed first: one step with input shapes and dtypes recorded, and with a
    memory snapshot asked for, one step under the allocator's history. Then the timed
    profile, CPU and CUDA activity only (no shapes, no memory, no stacks), under a schedule
    of ``PROFILE_SCHEDULE`` steps of which only the active one is read (the profiler's own
    start-up falls in the others); each timed op takes the dtypes of its twin in the shapes
    step. On the CPU one step, timed, with shapes, dtypes and the allocator's events (the
    memory peak) recorded.

    ``live_bytes``: tensor bytes alive before the step (parameters, buffers, quantisation
    state, optimizer state, batches), the base of the CPU memory peak.
    """
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    cuda = device.type == "cuda"

    def one_step():
        with record_function(STEP_RANGE):
            step()
        if cuda:
            torch.cuda.synchronize(device)

    if not cuda:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                     profile_memory=True) as prof:
            one_step()
        peak = live_bytes + _cpu_allocator_peak(prof)
        method = ("tensor bytes alive before the step (parameters, buffers, quantisation "
                  "state, optimizer state, batches) + the highest net bytes the CPU "
                  "allocator handed out during the profiled step (torch.profiler memory "
                  "events)")
        # a written trace is analysed from the file (it carries the dtypes): no event tree
        events = None if trace_file else prof.events()
        by_id = None if events is None else recorded_dtypes(prof, events)
        return _analysed(prof, "cpu", trace_file, events, by_id, (), peak, method,
                         "recorded in the same step", None)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as shaped_prof:
        one_step()
    events = shaped_prof.events()
    by_id = recorded_dtypes(shaped_prof, events)
    shaped, _, _ = _calls_from(events, by_id)
    peak = int(torch.cuda.max_memory_allocated(device))
    if memory_snapshot_file is not None:
        torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
        try:
            one_step()
            torch.cuda.memory._dump_snapshot(memory_snapshot_file)
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 schedule=schedule(**PROFILE_SCHEDULE)) as prof:
        for _ in range(sum(PROFILE_SCHEDULE.values())):
            one_step()
            prof.step()
    return _analysed(prof, "cuda", trace_file, None, by_id, shaped, peak,
                     "torch.cuda.max_memory_allocated over an untimed step (shapes recorded)",
                     "recorded in an untimed step (the k-th call of an op there is its k-th "
                     "call in the timed step)", memory_snapshot_file)


def _analysed(prof, device_kind: str, trace_file: str | None, events, by_id,
              shaped: list[OpCall], peak: int, peak_method: str, dtypes_where: str,
              memory_snapshot_file: str | None) -> ProfiledStep:
    """The analysis of the timed profile ``prof`` (its ``events`` when already listed), each
    op with the dtypes of its twin in ``shaped`` where it recorded none."""
    import dataclasses

    if trace_file:
        # the analysis is read back from the written trace, so the figures shown are the
        # ones a reader of that file (or the trace-replay tests) gets
        prof.export_chrome_trace(trace_file)
        calls, step_us, spans = _calls_from(chrome_trace_events(trace_file))
    elif events is not None:
        calls, step_us, spans = _calls_from(events, by_id)
    else:
        calls, step_us, spans = _calls_from(prof.events(), {})
    result = analyse(_join_shapes(calls, shaped), device_kind, step_us, spans)
    dtype_method = ("n/a: this torch's profiler records no input dtypes, so every op's "
                    "dtype is unknown" if by_id == {} else
                    f"{result.dtype_method}; {dtypes_where}")
    return dataclasses.replace(
        result, peak_memory_bytes=peak, peak_memory_method=peak_method, trace_file=trace_file,
        memory_snapshot_file=memory_snapshot_file, dtype_method=dtype_method)


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
        if ps.basis_note:
            odd_lines.append(f"  {t.precision}: {ps.basis_note}")
        if workspace := workspace_line(ps):
            odd_lines.append(f"  {t.precision}: {workspace}")
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
            hint = padding_hint(ps.odd_gemms, ps.step_ms)
            if hint:
                odd_lines.append(f"  {t.precision}: {hint}")
        unattributed = ps.category_share.get(UNATTRIBUTED)
        if unattributed:
            odd_lines.append(f"  {t.precision}: {_pct(unattributed)} of the step in kernels "
                             "no CPU op enclosed (unattributed)")
        tc_note = ps.tensor_core_reason and (
            f"on TC (Tensor Core share of matmul time) "
            f"{'n/a: ' if ps.tensor_core_share is None else ''}{ps.tensor_core_reason}")
        for reason in (ps.idle_gap_reason and f"idle gaps n/a: {ps.idle_gap_reason}",
                       tc_note, f"time: {ps.time_basis}"):
            if reason:
                notes[reason] = None
    lines += odd_lines
    lines += [f"  {n}" for n in notes]
    return "\n".join(lines)
