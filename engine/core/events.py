"""What the engine says: frozen dataclasses with units in their field names.

They cross thread and process boundaries (pickled) and serialise to JSON as they
are (``to_dict``); ``from_dict`` rebuilds them, nested ones included, so a report
written on a server becomes the same objects in the window. No Qt type appears here.
A field the hardware or the run cannot give is ``None`` and, where it matters, a
``*_reason`` field says why.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache

TRIAL_STATUSES = ("ok", "oom", "unsupported", "error", "cancelled")


def to_dict(obj) -> dict:
    """Plain-JSON form of an event, as ``dataclasses.asdict`` gives it, except that any other
    sequence (a read journal's steps, kept as columns) becomes a list."""
    return _plain(obj)


_LEAVES = frozenset({type(None), bool, int, float, str})


@cache
def _field_names(cls) -> tuple[str, ...] | None:
    return tuple(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(
        cls) else None


def _plain(value):
    if type(value) in _LEAVES:  # most values: checked first, a report holds many
        return value
    names = _field_names(type(value))
    if names is not None:
        return {name: _plain(getattr(value, name)) for name in names}
    if isinstance(value, list | tuple):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [_plain(v) for v in value]
    return value


@cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _convert(tp, value):
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _convert(args[0], value) if len(args) == 1 else value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value)
    if origin in (list, tuple):
        args = typing.get_args(tp)
        inner = args[0] if args else typing.Any
        items = [_convert(inner, v) for v in value]
        return tuple(items) if origin is tuple else items
    if tp is float and isinstance(value, int):
        return float(value)
    return value


def from_dict(cls, data: dict):
    """Rebuild ``cls`` from ``to_dict`` output; unknown keys are ignored (newer writers)."""
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            kwargs[f.name] = _convert(hints[f.name], data[f.name])
    return cls(**kwargs)


# --- live events -------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingData:
    """What the trials trained on and measured held-out loss on (DESIGN 24): the built-in
    text, a user's file, or uniform random tokens. How many batches each trial drew from it
    is the trial's own (``TrialSummary.distinct_batches``, ``HeldOutLoss.batches``)."""

    source: str  # "pydoc_data.topics (CPython docs)", a file's name and size, or random tokens
    tokenisation: str | None  # "byte-level", the model's tokenizer, a file's id type; None: random
    tokens: int | None  # tokens in the stream; None: random tokens, drawn afresh
    train_part_tokens: int | None  # the stream's first part, where every training window lies
    heldout_part_tokens: int | None  # its last part, where every held-out window lies
    method: str  # how the batches are drawn from it


@dataclass(frozen=True)
class RunStarted:
    run_id: str
    config: dict
    environment: dict
    time_s: float
    data: TrainingData | None = None  # None: a user's own loop, or an older AmpScope


@dataclass(frozen=True)
class TrialStarted:
    precision: str
    index: int
    total: int
    time_s: float
    round: int = 0  # 0-based round of this precision when precisions are interleaved
    rounds: int = 1


PHASES = ("loading", "warm-up", "measuring", "memory step", "profiled step", "between rounds",
          "probes")
"""What a trial is doing: loading its model (a child process starting included), unmeasured
warm-up steps, measured steps, the untimed step that tracks memory, the extra step under
torch.profiler, (interleaved runs) waiting for the other precisions' round, and the untimed
forward passes before the first step that count FLOPs and measure the quantisation error."""


@dataclass(frozen=True)
class PhaseChanged:
    """A trial enters ``phase`` (one of ``PHASES``) in round ``round`` (0-based)."""

    precision: str
    phase: str
    time_s: float
    round: int = 0


@dataclass(frozen=True)
class StepSample:
    """One measured (or warm-up) optimiser step of one trial."""

    precision: str
    step: int
    warmup: bool
    loss: float | None
    step_ms: float
    tokens_per_s: float | None  # None: a user's step whose tokens are unknown
    tflops: float | None  # model FLOPs (no recompute) / step time, in TFLOP/s
    mfu: float | None  # model FLOPs utilisation: tflops / the (blended) datasheet peak
    allocated_bytes: int | None
    reserved_bytes: int | None
    loss_scale: float | None
    skipped: bool
    grad_norm: float | None
    time_s: float
    round: int = 0  # which round of an interleaved run measured it (engine/run/rounds.py)
    hfu: float | None = None  # hardware FLOPs (counted, recompute included) / time / peak
    tokens: int | None = None  # tokens this step trained on (user runs: padding excluded)
    learning_rate: float | None = None  # user runs: the optimiser's lr at this step
    # user runs: where the step's time went (with eval_ms, save_ms they add up to step_ms)
    data_ms: float | None = None  # step start to the first forward, and between micro-batches
    forward_ms: float | None = None  # inside the model's training forwards
    backward_ms: float | None = None  # each backward (its gradients), to the optimizer step
    optimizer_ms: float | None = None  # the optimizer step's start to the step's end
    # tflops / the device's measured matmul peak (engine.measure.matmul_peak), blended alike
    mfu_measured: float | None = None
    # user runs: an evaluation inside the step (model.eval() or no_grad forwards and what
    # runs between them), a part of step_ms the other four leave out
    eval_ms: float | None = None
    # user runs: the Trainer's checkpoint saves inside the step that triggered them
    save_ms: float | None = None


@dataclass(frozen=True)
class MonitorSample:
    """One poll of the device monitor: NVML on a GPU, psutil for the host otherwise."""

    time_s: float
    source: str  # "nvml" or "host"
    gpu_util_pct: float | None = None
    mem_util_pct: float | None = None
    gpu_mem_used_bytes: int | None = None
    gpu_mem_total_bytes: int | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    sm_clock_mhz: float | None = None
    energy_j: float | None = None
    process_mem_bytes: int | None = None
    process_mem_method: str | None = None  # by process id, or device-wide minus a baseline
    cpu_pct: float | None = None
    host_rss_bytes: int | None = None
    host_mem_used_bytes: int | None = None
    # NVML GPM (Hopper and newer) since the previous poll: tensor pipes, SMs, DRAM
    gpm_tensor_any_util_pct: float | None = None
    gpm_tensor_hmma_util_pct: float | None = None
    gpm_tensor_imma_util_pct: float | None = None
    gpm_sm_util_pct: float | None = None
    gpm_sm_occupancy_pct: float | None = None
    gpm_dram_bw_util_pct: float | None = None
    gpm_reason: str | None = None  # why GPM is n/a: on the first poll that meets it only
    # the machine's load (engine/measure/contention.py), on GPU runs too: busy hosts slow steps
    load_avg_1m: float | None = None  # /proc/loadavg's 1-minute load average
    other_cpu_pct: float | None = None  # processes outside this run, % of all cores


@dataclass(frozen=True)
class LogEvent:
    level: str  # "info", "warning", "error"
    message: str
    precision: str | None = None
    time_s: float = 0.0


@dataclass(frozen=True)
class ScalarLog:
    """A scalar a user's loop logged at one of its steps (``Recorder.log``: eval loss...)."""

    precision: str
    step: int  # the optimiser step in progress when it was logged
    name: str
    value: float | None  # None: the value was not a finite number (inf, NaN)
    time_s: float


@dataclass(frozen=True)
class ErrorEvent:
    """A failure outside any trial (the run could not start, the model did not load)."""

    message: str
    precision: str | None = None
    time_s: float = 0.0


# --- trial results -----------------------------------------------------------------


@dataclass(frozen=True)
class ParamInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str
    device: str
    bytes: int
    numel: int
    trainable: bool
    module_type: str
    tied_to: str | None = None  # name of the parameter this one shares storage with


@dataclass(frozen=True)
class LayerSqnr:
    """One matmul layer's quantisation error as its trial's recipe rounds it: the
    signal-to-quantisation-noise ratio 10 log10(sum x^2 / sum (x - q(x))^2) of its weight
    and of its input on one batch. None: nothing was rounded (already in the format)."""

    name: str
    format: str  # how the recipe rounds this layer's operands, e.g. "fp8 e4m3 tensorwise"
    weight_db: float | None
    input_db: float | None
    reason: str | None = None  # an n/a dB that is no number (inf/NaN), not an exact one


@dataclass(frozen=True)
class QuantError:
    """The per-layer SQNR of a trial, with the median and the worst layer of each operand
    (over the layers that round it; None when none does)."""

    method: str
    layers: list[LayerSqnr] = field(default_factory=list)
    weight_median_db: float | None = None
    weight_min_db: float | None = None
    input_median_db: float | None = None
    input_min_db: float | None = None
    reason: str | None = None  # layers whose SQNR is no number (left out of the above)


@dataclass(frozen=True)
class LostUpdateGroup:
    """One parameter group's lost updates at one learning rate (engine.measure.lost_updates).

    Of the elements whose intended update (the optimiser's step computed in fp32) was
    non-zero, the share whose stored weight did not change, and that share's part of the
    intended update's L2 norm. ``kept_share`` is the applied change projected on the
    intended update, over its squared norm: about 1 when the update lands on average
    (stochastic rounding), about 1 - lost when round-to-nearest drops it."""

    group: str  # "embeddings", "norms", "matmul weights", "other" (biases, ...)
    lr: float
    updated_elements: int  # elements whose intended update was non-zero
    element_share: float | None
    norm_share: float | None
    kept_share: float | None


@dataclass(frozen=True)
class LostUpdates:
    """What share of one optimiser step the stored (below-fp32) weights lost, overall at the
    configured rate (``element_share``, ``norm_share``, ``kept_share``) and by group at both
    rates (``groups``: the configured ``lr`` and the schedule's smallest ``min_lr``)."""

    method: str
    weight_dtype: str  # the trained weights' storage dtype, e.g. "bfloat16"
    rounding: str  # "nearest" or "stochastic": how the optimiser writes the weights back
    lr: float
    min_lr: float
    element_share: float | None
    norm_share: float | None
    kept_share: float | None
    min_lr_element_share: float | None
    min_lr_norm_share: float | None
    min_lr_kept_share: float | None
    groups: list[LostUpdateGroup] = field(default_factory=list)


@dataclass(frozen=True)
class HeldOutLoss:
    """The mean loss on batches no step trained on, before the first step and after the
    last (engine.models.heldout); the same batches for every precision of a run."""

    method: str
    batches: int
    tokens: int
    loss_before: float
    loss_after: float
    steps: int  # optimiser steps between the two evaluations


@dataclass(frozen=True)
class ModuleInfo:
    """One node of the module tree, with the bytes of its own and its children's params."""

    name: str
    type: str
    depth: int
    bytes: int
    params: int
    quantized: bool
    # the dtype(s) its matmul layers multiply in ("fp8", "bf16", "bf16, fp8" for a parent
    # of both); None where not known (bitsandbytes layers, a user's own loop)
    matmul_dtype: str | None = None


@dataclass(frozen=True)
class MemoryBreakdown:
    """Measured memory of one trial in bytes: the peak and, by category, what was held then.

    ``total_bytes`` is the measured peak; the ``*_bytes`` categories are the storages
    alive at that moment (engine.measure.memtrack) and add up to it. Parameters exclude buffers;
    quantisation state (bitsandbytes' absmax, SCB) is its own category.
    """

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int | None
    activations_method: str
    temporaries_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    nvml_process_bytes: int | None = None
    context_gap_bytes: int | None = None  # NVML process memory minus reserved, same moment
    nvml_method: str = ""  # how nvml_process_bytes was found
    reserved_at_nvml_read_bytes: int | None = None  # allocator reserved when NVML was read
    total_bytes: int = 0
    total_method: str = ""
    notes: str = ""
    buffers_bytes: int | None = None
    quant_state_bytes: int | None = None
    weight_copies_bytes: int | None = None  # autocast's cast weights, dequantised weights
    inputs_bytes: int | None = None  # the batch
    peak_phase: str | None = None  # "forward", "backward" or "optimizer"
    # "backward"/"optimizer" -> category -> bytes held when that phase began (what the
    # forward saved for backward; every gradient)
    at_phase_start_bytes: dict = field(default_factory=dict)


@dataclass(frozen=True)
class MemoryTimelinePoint:
    """One moment of the watched step: the bytes each category held right after one
    allocation or release (or at a phase's start)."""

    op_index: int  # aten ops the step had dispatched by then (the x axis)
    phase: str  # "forward", "backward", "recompute <layer>", "optimizer", "zero_grad"
    category_bytes: list[int]  # in MemoryTimeline.categories' order; they sum to the total
    module: str | None = None  # the module whose forward was running; None: not in one


@dataclass(frozen=True)
class MemoryTimeline:
    """Bytes by category across one watched step (engine.measure.memory_timeline), thinned:
    every kept point is a real moment, unchanged; the peak is always kept."""

    categories: list[str]  # engine.measure.memtrack.CATEGORIES
    points: list[MemoryTimelinePoint]
    peak_index: int  # the point holding the peak (the first moment it was reached)
    peak_bytes: int  # its total: the trial's memory.total_bytes
    ops: int  # aten ops the step dispatched
    changes: int  # allocation changes logged, before thinning
    method: str = ""  # what a point is and how the points were chosen


@dataclass(frozen=True)
class PredictedMemory:
    """What an analytic model of the recipe expects, in bytes."""

    params_bytes: int
    master_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    total_bytes: int
    bytes_per_param: dict = field(default_factory=dict)
    formula: str = ""
    error_pct: dict = field(default_factory=dict)  # category -> 100*(predicted-measured)/measured
    buffers_bytes: int = 0
    quant_state_bytes: int = 0  # bitsandbytes absmax / SCB beside the quantised weights
    weight_copies_bytes: int = 0  # autocast's low-precision weight copies saved for backward
    activations_method: str = ""  # calibrated per-layer model, or the uncalibrated fallback
    inputs_bytes: int = 0  # the batch
    # backward's start: the loss's gradient of the logits and of their log-softmax
    temporaries_bytes: int = 0
    peak_phase: str = ""  # the formula's phase that is the peak ("backward start", ...)
    # category -> bytes held in that phase: they add up to total_bytes
    at_peak_bytes: dict = field(default_factory=dict)


@dataclass(frozen=True)
class FlopsInfo:
    """FLOPs of one optimiser step in two conventions (engine.measure.flops).

    ``counted_per_step`` are the hardware FLOPs (what ran, recompute included: HFU);
    ``analytic_per_step`` the model FLOPs (PaLM / nanoGPT, no recompute: MFU).
    """

    counted_per_step: int | None
    counted_method: str
    analytic_per_step: int | None  # None: a user's model without a transformers config
    analytic_formula: str
    by_op: dict = field(default_factory=dict)
    by_peak_dtype: dict = field(default_factory=dict)  # hardware FLOPs by peak-table dtype
    model_convention: str = ""
    hardware_convention: str = ""


@dataclass(frozen=True)
class StepTimeSpread:
    """How much the measured step times of one trial vary (conventions: engine/record/spread.py)."""

    steps: int
    p10_step_ms: float
    p90_step_ms: float
    mean_step_ms: float
    cv: float | None  # coefficient of variation: sample std (ddof=1) / mean; None for 1 step
    median_step_ms_ci: tuple[float, float] | None  # None below spread.MIN_STEPS steps
    tokens_per_s_ci: tuple[float, float] | None
    ci_level: float
    method: str
    rounds: int = 1


@dataclass(frozen=True)
class HostLoad:
    """How busy the machine was while a trial ran (rules in engine/measure/contention.py).

    Means and maxima over the monitor samples taken between the trial's start and end
    (every round of an interleaved precision); None where the host could not say.
    """

    cpu_count: int
    samples: int
    load_avg_1m_mean: float | None
    load_avg_1m_max: float | None
    other_cpu_pct_mean: float | None  # processes outside this run, % of all cores
    other_cpu_pct_max: float | None


@dataclass(frozen=True)
class TrialSummary:
    steps_measured: int
    median_step_ms: float | None
    tokens_per_s: float | None
    tflops: float | None  # model FLOPs / median step time
    mfu: float | None  # against the datasheet peak blended by the dtypes the step ran
    mfu_reason: str | None
    peak_flops: float | None
    peak_flops_source: str | None
    peak_memory_bytes: int | None
    peak_memory_method: str
    skipped_steps: int
    final_loss: float | None
    final_loss_scale: float | None
    energy_per_step_j: float | None = None
    energy_per_token_j: float | None = None
    energy_method: str = ""  # how the energy was measured, or why it is n/a
    spread: StepTimeSpread | None = None
    distinct_batches: int | None = None  # batches of the run's data cycled through the steps
    hardware_tflops: float | None = None  # hardware FLOPs / median step time
    hfu: float | None = None
    # the same model FLOPs against the measured matmul peak of this machine (the datasheet
    # peak is ``peak_flops``): named "MFU vs measured matmul peak" wherever it is shown
    mfu_measured: float | None = None
    mfu_measured_reason: str | None = None
    measured_peak_flops: float | None = None
    measured_peak_source: str | None = None
    # the same model FLOPs against one denominator for every recipe on the device
    # (engine.measure.peaks.COMMON_CONVENTION): "MFU vs common 16-bit peak" wherever shown
    mfu_common: float | None = None
    mfu_common_reason: str | None = None
    common_peak_flops: float | None = None
    common_peak_source: str | None = None


@dataclass(frozen=True)
class OpTime:
    """Self time of one aten op with one input dtype in the profiled step."""

    op: str  # profiler name, e.g. "aten::addmm"
    dtype: str  # the op's first floating-point input dtype ("-" if none)
    category: str  # matmul, elementwise/normalisation, copy/cast, optimizer, GradScaler, ...
    calls: int
    self_ms: float  # CPU self time on the CPU, launched kernels' device time on a GPU
    step_share: float | None  # of the profiled step's time


@dataclass(frozen=True)
class KernelTime:
    """One GPU kernel name launched by one op in the profiled step (op "unattributed":
    no CPU op enclosed its launch)."""

    name: str
    op: str
    dtype: str
    calls: int
    ms: float
    tensor_core: bool | None  # None: not a matmul kernel, or its name cannot tell
    kind: str = ""  # matmul, attention, matmul helper, elementwise, communication, ...
    tensor_core_why: str = ""  # what in the name decided the kind and the verdict


@dataclass(frozen=True)
class GemmShapeTime:
    """A GEMM shape of the profiled step whose M, N or K is off the Tensor Core multiple."""

    op: str
    dtype: str
    m: int
    n: int
    k: int
    calls: int
    ms: float
    tensor_core: bool | None  # GPU: did all its kernels run on Tensor Cores; None on the CPU
    reason: str


@dataclass(frozen=True)
class ProfiledStep:
    """One extra step under torch.profiler, never counted among the measured steps."""

    time_basis: str  # what an op's time and the step's time are
    step_ms: float
    category_ms: dict = field(default_factory=dict)  # category -> ms
    category_share: dict = field(default_factory=dict)  # category -> share of step_ms
    matmul_share_by_dtype: dict = field(default_factory=dict)  # dtype -> share of step_ms
    ops: list[OpTime] = field(default_factory=list)  # most time first
    kernels: list[KernelTime] = field(default_factory=list)  # GPU only
    idle_gap_ms: float | None = None  # GPU: time in the step with no kernel running
    idle_gap_share: float | None = None
    idle_gap_reason: str | None = None
    tensor_core_share: float | None = None  # of matmul kernel time, by kernel names
    tensor_core_reason: str | None = None
    peak_memory_bytes: int | None = None
    peak_memory_method: str = ""
    dtype_method: str = ""
    trace_file: str | None = None  # Chrome trace JSON of this step, when asked for
    memory_snapshot_file: str | None = None  # CUDA allocator snapshot, when asked for
    odd_gemms: list[GemmShapeTime] = field(default_factory=list)  # most time first
    # the shares' basis (engine/measure/step_basis.py): on a GPU, shares of the measured
    # median step, step_ms being that median; None where no measured step was known
    measured_step_ms: float | None = None
    profiled_step_ms: float | None = None  # the profiled step's own span (GPU) or wall (CPU)
    kernel_busy_ms: float | None = None  # GPU: union of the profiled step's kernel time
    basis_note: str | None = None  # the profiled kernels' time is >10% off the measured step
    # CPU: peak_memory_bytes minus the trial's tracked tensor peak, same step shapes: bytes
    # kernels held that no tensor did (engine.measure.kernel_workspace); None elsewhere
    kernel_workspace_bytes: int | None = None


@dataclass(frozen=True)
class GpmMetrics:
    """NVML GPM rates over a window (Hopper and newer); all None with ``reason`` elsewhere."""

    tensor_any_util_pct: float | None = None  # SMs doing any tensor (MMA) work
    tensor_hmma_util_pct: float | None = None  # half-precision MMA (fp16/bf16/tf32)
    tensor_imma_util_pct: float | None = None  # integer MMA
    sm_util_pct: float | None = None  # SMs busy
    sm_occupancy_pct: float | None = None  # active warps vs the maximum
    dram_bw_util_pct: float | None = None  # DRAM bandwidth used vs the maximum
    window_s: float | None = None
    window: str = ""
    reason: str | None = None
    na_reason: str | None = None  # which metrics are None with values around and why (NaN)


@dataclass(frozen=True)
class CommVolume:
    """Payload bytes of one collective in one dtype per optimiser step (largest buffer)."""

    collective: str  # "all_reduce", "all_gather", "reduce_scatter", ...
    dtype: str  # torch dtype name, e.g. "bfloat16"
    measured_bytes: int | None
    expected_bytes: int | None
    calls_per_step: float = 0.0


@dataclass(frozen=True)
class RankMemory:
    """One rank's memory by category, in bytes (measured, or predicted for the strategy)."""

    sharded_params_bytes: int  # this rank's parameters at rest (its shard; all of them in DDP)
    unsharded_params_bytes: int | None  # peak of all-gathered parameters alive at once (FSDP2)
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int | None
    comm_buffers_bytes: int | None  # DDP gradient buckets; FSDP2's are transient
    peak_allocated_bytes: int | None = None
    total_bytes: int = 0
    total_method: str = ""
    notes: str = ""


@dataclass(frozen=True)
class RankResult:
    """One torchrun rank of a distributed trial."""

    rank: int
    local_rank: int
    host: str
    pid: int
    status: str  # "ok", or "oom"/"error" for the rank that failed, "stopped" for the others
    reason: str | None = None
    steps: list[StepSample] = field(default_factory=list)
    memory: RankMemory | None = None
    predicted_memory: RankMemory | None = None
    memory_error_pct: dict = field(default_factory=dict)  # 100*(predicted-measured)/measured
    monitor_samples: list[MonitorSample] = field(default_factory=list)
    comm: list[CommVolume] = field(default_factory=list)
    median_step_ms: float | None = None
    tokens_per_s: float | None = None  # this rank's own tokens


@dataclass(frozen=True)
class DistributedSummary:
    """What a distributed trial adds: the recipe's wire dtypes and the spread over ranks."""

    strategy: str  # "ddp" or "fsdp2"
    world_size: int
    nproc_per_node: int
    backend: str  # "gloo" or "nccl"
    sharded: str
    collectives: dict  # collective -> dtype name the recipe sends it in
    slowest_rank: int | None = None
    slowest_step_ms: float | None = None  # median step of the slowest rank
    fastest_step_ms: float | None = None
    step_spread_pct: float | None = None  # 100*(slowest-fastest)/fastest
    max_memory_bytes: int | None = None
    min_memory_bytes: int | None = None
    total_tokens_per_s: float | None = None  # global batch tokens / slowest rank's median
    comm: list[CommVolume] = field(default_factory=list)  # rank 0, per step
    comm_method: str = ""
    comm_time_reason: str = ""
    failed_rank: int | None = None
    comm_hook: str | None = None  # the DDP communication hook that ran, and under what name


@dataclass(frozen=True)
class TrialResult:
    precision: str
    status: str  # one of TRIAL_STATUSES
    reason: str | None = None
    recipe: str = ""
    device: str = ""
    param_count: int = 0
    trainable_params: int = 0
    load_footprint_bytes: int | None = None
    footprint_note: str = ""
    memory: MemoryBreakdown | None = None
    predicted_memory: PredictedMemory | None = None
    dtype_map: list[ParamInfo] = field(default_factory=list)
    module_tree: list[ModuleInfo] = field(default_factory=list)
    flops: FlopsInfo | None = None
    steps: list[StepSample] = field(default_factory=list)
    summary: TrialSummary | None = None
    numerics: dict | None = None
    notes: list[str] = field(default_factory=list)  # what to know reading these figures
    lora: dict | None = None  # r, alpha, dropout, target_modules, trainable counts
    started_s: float = 0.0
    finished_s: float = 0.0
    profiled_step: ProfiledStep | None = None
    profiled_step_reason: str | None = None
    gpm: GpmMetrics | None = None
    ranks: list[RankResult] = field(default_factory=list)  # distributed trials only
    distributed: DistributedSummary | None = None
    host_load: HostLoad | None = None  # None: not sampled (older reports, user runs)
    # "profile" (AmpScope trained it), or a user's own training recorded through the
    # public API: "user-loop" (ampscope.Recorder), "user-trainer" (ampscope.AmpScopeCallback)
    source: str = "profile"
    # engine/measure/gating.py's verdict on the trial's device: "native", "emulated" (it ran, but
    # not on the format's own hardware: speed not representative) or "unsupported", with
    # the reason; None in older reports and user runs
    support: str | None = None
    support_reason: str | None = None
    # the SQNR of each matmul layer's weight and input as the recipe quantises them;
    # None with ``quant_error_reason`` where the recipe rounds nothing or it was not measured
    quant_error: QuantError | None = None
    quant_error_reason: str | None = None
    # whether the timed steps ran under torch.compile (fp8 compiles by default on a GPU
    # whatever the run's --compile); None: the trial never reached its steps, older reports
    compiled: bool | None = None
    # the share of one optimiser step the stored weights lost (weights below fp32 only);
    # None with the reason where the weights are fp32 or it was not measured (older reports)
    lost_updates: LostUpdates | None = None
    lost_updates_reason: str | None = None
    # the loss on held-out batches before and after training; None in older reports
    heldout_loss: HeldOutLoss | None = None
    heldout_loss_reason: str | None = None

    # bytes by category across the memory step (its peak is ``memory.total_bytes``); None
    # where no step was watched (older reports, user runs, a stopped trial)
    memory_timeline: MemoryTimeline | None = None

    # where the trial's wall-clock time went (engine.run.phase_clock): phase -> seconds,
    # rounds summed, and when each phase of its last round began (epoch seconds; "end": the
    # trial's process was gone); None for user runs, distributed trials and older reports
    phase_times: dict[str, float] | None = None
    phase_starts: dict[str, float] | None = None
    # the exception that ended the trial ("error" or "oom") as Python prints it, its middle
    # cut past the reader's text limit (engine.record.bounded); ``reason`` is its one line.
    # None when no exception ended it (and in older reports)
    traceback: str | None = None
    # an ":auto" recipe's card, layers converted and kept in bf16 (engine/run/fp8_auto.py);
    # None for every other recipe
    fp8_auto: dict | None = None


@dataclass(frozen=True)
class TrialFinished:
    result: TrialResult
    time_s: float


@dataclass(frozen=True)
class RunFinished:
    status: str  # "ok", "cancelled" or "error"
    time_s: float


Event = (
    RunStarted
    | TrialStarted
    | PhaseChanged
    | StepSample
    | MonitorSample
    | LogEvent
    | ScalarLog
    | ErrorEvent
    | TrialFinished
    | RunFinished
)
