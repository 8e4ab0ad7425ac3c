"""The plain records the profiled step's analysis reads, and what one of them says alone.

``OpCall`` is one op call (its enclosing ranges, input dtypes and shapes, self time, the
kernels it launched); ``DeviceSpan`` one kernel, memcpy or memset on the GPU timeline.
Built from a live ``torch.profiler`` or a Chrome trace (engine/measure/kernels.py), they
keep the analysis testable without a GPU. Here: an op's dtype, whether it is a matmul,
whether its GEMM shape is off the Tensor Core multiple, and the device's idle gaps.
"""

from __future__ import annotations

from dataclasses import dataclass

_MATMUL_OPS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_mm", "_int_mm",
               "addmv", "mv", "dot", "einsum", "convolution", "_convolution", "conv1d",
               "conv2d", "scaled_dot_product_attention"}
_MATMUL_PREFIXES = ("_scaled_dot_product_", "_flash_attention", "_efficient_attention",
                    "cudnn_convolution", "mkldnn_convolution", "_cudnn_attention")

# profiler dtype names (c10 scalar type names) -> torch's names
_DTYPE_NAMES = {
    "float": "float32", "double": "float64", "c10::Half": "float16",
    "c10::BFloat16": "bfloat16", "c10::Float8_e4m3fn": "float8_e4m3fn",
    "c10::Float8_e5m2": "float8_e5m2", "signed char": "int8", "unsigned char": "uint8",
    "long int": "int64", "int": "int32", "short int": "int16", "bool": "bool",
}
_FLOATING = ("float32", "float64", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")


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
    name: str = ""
    attributed: bool = True  # False: no CPU op enclosed its launch (the unattributed bucket)


def op_dtype(input_dtypes: tuple[str, ...]) -> str:
    """The op's dtype: its first floating input, else its first tensor input, else "-"."""
    names = [_DTYPE_NAMES[d] for d in input_dtypes if d in _DTYPE_NAMES]
    floating = [d for d in names if d in _FLOATING]
    return (floating or names or ["-"])[0]


def is_matmul(name: str) -> bool:
    short = name.removeprefix("aten::")
    return short in _MATMUL_OPS or short.startswith(_MATMUL_PREFIXES)


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


def odd_reason(m: int, n: int, k: int, multiple: int) -> str:
    odd = [f"{label}={v}" for label, v in zip("MNK", (m, n, k)) if v % multiple]
    return (f"{', '.join(odd)} not a multiple of {multiple}: Tensor Cores need padding or a "
            "slower kernel")


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
