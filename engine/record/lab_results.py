"""The numerics lab's results as plain data: what the lab returns and a report stores.

Kept here, below the lab (engine.numerics) and free of torch, so the guard on anything
read back (engine.record.validate) checks a report's ``numerics`` section against these
shapes without importing the lab that fills them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FormatInfo:
    """One number format (engine.numerics.formats)."""

    name: str
    kind: str  # "float", "matmul-mode", "int" or "codebook"
    torch_dtype: str | None  # None for TF32, which is no storage dtype
    bits: int
    sign_bits: int | None  # None for a code book (bits index a table of values)
    exponent_bits: int | None
    mantissa_bits: int | None
    max: float | None
    min_normal: float | None
    min_subnormal: float | None  # smallest magnitude above zero
    eps: float | None
    decimal_digits: float | None
    note: str
    codebook: tuple[float, ...] | None = None
    # block-scaled formats: elements share one scale per block; the range figures are the
    # element's times the scale's (NVFP4: in units of its per-tensor fp32 scale)
    block_size: int | None = None
    scale_format: str | None = None


@dataclass(frozen=True)
class DemoResult:
    """One rounding experiment run on the device (engine.numerics.demos)."""

    name: str  # the demo's group, e.g. "one_plus_small"
    expression: str
    dtype: str
    result: float | str
    expected_exact: float | str
    verdict: str  # "kept", "swallowed", "inf", "zero", "nonzero", "dtype", "drift"
    explanation: str
    device: str


# gradients and activations against each format's range (engine.numerics.gradients)
@dataclass(frozen=True)
class FormatRange:
    name: str
    log2_min_subnormal: float
    log2_min_normal: float
    log2_max: float


@dataclass(frozen=True)
class Histogram:
    log2_edges: tuple[float, ...]  # len(counts) + 1 edges; bin i is (edge i, edge i+1]
    counts: tuple[int, ...]


@dataclass(frozen=True)
class GroupStats:
    name: str
    tensors: int
    values: int
    nonzero: int
    nonfinite: int
    max_abs: float | None
    dtypes: tuple[str, ...]
    histogram: Histogram
    underflow_fp16_scale1: float | None  # fraction of nonzero values
    underflow_fp16_at_scale: float | None
    above_fp16_max: float | None  # fraction of nonzero values beyond fp16's max


@dataclass(frozen=True)
class GradientStats:
    loss: float
    loss_scale: float  # the scale the fp16 figures are computed at
    backward_scale: float  # the scale the backward pass itself ran at (then divided out)
    bins_per_octave: int
    overall: GroupStats
    groups: tuple[GroupStats, ...]
    underflow_scale1: dict  # format name -> fraction of nonzero gradients flushed at scale 1
    overflow_ratio_fp16: float | None  # max|g| * loss_scale / fp16 max (above 1: inf)
    headroom_log2: float | None  # binades between max|g| * loss_scale and fp16 max
    suggested_scale_min: float | None
    suggested_scale_max: float | None
    suggestion_note: str
    underflow_target: float
    format_ranges: tuple[FormatRange, ...]


@dataclass(frozen=True)
class ActivationStats:
    bins_per_octave: int
    modules: tuple[GroupStats, ...]  # one per module type, over all its outputs
    format_ranges: tuple[FormatRange, ...]


# which dtype each aten op ran in (engine.numerics.optrace)
@dataclass(frozen=True)
class OpStat:
    """The calls of one op in one phase with one dtype signature."""

    op: str  # aten overload, e.g. "aten.mm.default"
    phase: str  # "forward" or "backward"
    count: int
    input_dtypes: tuple[str, ...]  # distinct dtypes of the tensor arguments, in order
    output_dtypes: tuple[str, ...]
    flops: int
    flops_share: float | None  # of the step's counted FLOPs
    precision_sensitive: bool


@dataclass(frozen=True)
class GemmFlag:
    op: str
    phase: str
    m: int
    n: int
    k: int
    dtype: str
    multiple: int  # 8, or 16 for fp8
    reason: str


@dataclass(frozen=True)
class OpTrace:
    ops: tuple[OpStat, ...]  # most FLOPs first
    total_flops: int
    flops_by_peak_dtype: dict  # peak-table key ("fp16", "tf32", ...) -> FLOPs
    flagged_gemms: tuple[GemmFlag, ...]
    uncounted_ops: tuple[str, ...]  # ops with no FLOP formula that may still do math


# the recommendation (engine.numerics.advisor)
@dataclass(frozen=True)
class Reason:
    text: str
    figure: str | None  # the number the reason rests on, with its unit; None: not measured
    source: str  # where the figure comes from


@dataclass(frozen=True)
class Alternative:
    precision: str
    reason: Reason


@dataclass(frozen=True)
class Advice:
    recommended: str
    init_scale: float | None  # GradScaler initial scale, for fp16 recommendations
    reasons: tuple[Reason, ...]
    also_try: tuple[Alternative, ...]
    warnings: tuple[Reason, ...]
