"""FLOPs of one training step in the two conventions the field uses, and the peak they meet.

*Model FLOPs* are what the model needs: the PaLM / nanoGPT count (Chowdhery et al. 2022,
appendix B), 6 FLOPs per matmul weight and token plus the attention scores, with no
recomputation, so they do not depend on the recipe, the attention kernel or gradient
checkpointing. MFU divides them by the peak.

*Hardware FLOPs* are what ran: ``torch.utils.flop_counter.FlopCounterMode`` over one
step, recomputation included (checkpointed layers run their forward twice, the CPU's
fused attention recomputes its scores in backward). HFU divides them by the peak.
FlopCounterMode counts matmul-like aten ops only; norms, activations, softmax and the
loss are a rounding error next to the matmuls, and the model count leaves them out for
the same reason. bitsandbytes' quantised matmuls are custom ops that torch has no
formula for, so they get one here.

A step whose matmuls run in several dtypes (fp8 layers beside bf16 ones, int8 forward
and fp16 backward) divides by a *blended* peak: the FLOPs over the time each dtype's
share would take at its own peak.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass
from torch.utils.flop_counter import (
    FlopCounterMode,
    _FlopCounterMode,
    flop_registry,
    sdpa_backward_flop_count,
    sdpa_flop_count,
    shape_wrapper,
)
from transformers.pytorch_utils import Conv1D

_aten = torch.ops.aten

MODEL_FLOPS_CONVENTION = (
    "model FLOPs: 6·N·T (2·N·T forward, 4·N·T backward; a frozen weight skips its own "
    "gradient) + the attention scores, no recomputation (PaLM / nanoGPT)"
)
HARDWARE_FLOPS_CONVENTION = (
    "hardware FLOPs: counted by torch FlopCounterMode over one step, recomputation "
    "included, bitsandbytes' quantised matmuls and emulated block-scaled GEMMs by registered "
    "formulas"
)


def _kv_at_query_heads(query_shape, *kv_shapes) -> tuple:
    """Grouped-query attention (transformers passes ``enable_gqa=True``): keys and values
    have fewer heads, which the kernel broadcasts to the query's, and every query head
    still scores every key, so K and V are counted at the query's head count. torch 2.13's
    formulas do this themselves; 2.11's reject the shapes."""
    heads = query_shape[1]
    return tuple((s[0], heads, *s[2:]) if s[1] != heads and heads % s[1] == 0 else s
                 for s in kv_shapes)


def _sdpa_flop(query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    return sdpa_flop_count(query_shape, *_kv_at_query_heads(query_shape, key_shape,
                                                             value_shape))


def _sdpa_backward_flop(grad_out_shape, query_shape, key_shape, value_shape, *args,
                        **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape,
                                    *_kv_at_query_heads(query_shape, key_shape, value_shape))


# torch registers formulas for the CUDA attention kernels only; without the CPU ones the
# CPU path of scaled_dot_product_attention would count as zero FLOPs. The CUDA ones are
# replaced so that grouped-query attention counts on every torch of the tested range.
ATTENTION_FLOPS = {
    _aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_flop,
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_backward_flop,
    _aten._scaled_dot_product_flash_attention: _sdpa_flop,
    _aten._scaled_dot_product_flash_attention_backward: _sdpa_backward_flop,
    _aten._scaled_dot_product_efficient_attention: _sdpa_flop,
    _aten._scaled_dot_product_efficient_attention_backward: _sdpa_backward_flop,
    _aten._scaled_dot_product_cudnn_attention: _sdpa_flop,
    _aten._scaled_dot_product_cudnn_attention_backward: _sdpa_backward_flop,
}


def _gemm_4bit_flop(a_shape, b_shape, shape_b, *args, **kwargs) -> int:
    # A (…, K) times the dequantised weight (N, K)^T: the packed B says nothing of N and K
    n, k = shape_b
    return 2 * math.prod(a_shape[:-1]) * n * k


def _int8_mixed_flop(a_shape, ca_shape, cb_shape, *args, out_shape=None, **kwargs) -> int:
    # the int8 product over all K columns, plus the fp16 product of the outlier columns
    m, n, k = math.prod(ca_shape[:-1]), cb_shape[0], ca_shape[-1]
    sub_a = out_shape[1] if out_shape else None
    outliers = sub_a[-1] if sub_a is not None and len(sub_a) == 2 else 0
    return 2 * m * n * k + 2 * m * n * outliers


def _int8_mm_flop(a_shape, b_shape, *args, **kwargs) -> int:
    # A (…, K) int8 times B (N, K)^T int8
    return 2 * math.prod(a_shape[:-1]) * b_shape[0] * a_shape[-1]


# bitsandbytes' torch ops (bitsandbytes/_ops.py) that multiply matrices. Each kernel runs
# its inner aten ops with the counting mode suspended, so the op itself must be counted.
BNB_FLOPS = {
    "gemm_4bit": _gemm_4bit_flop,  # 4-bit forward (CPU and CUDA)
    "gemv_4bit": _gemm_4bit_flop,  # 4-bit inference kernel (one row, or CPU-packed)
    "int8_mixed_scaled_mm": _int8_mixed_flop,  # LLM.int8 forward with outliers (CUDA)
    "int8_scaled_mm": _int8_mm_flop,  # int8 matmul + dequant, no outliers
    "int8_linear_matmul": _int8_mm_flop,  # the raw int8 GEMM (and its .out overload)
}
def _emulated_mm_flop(a_shape, b_shape, *args, **kwargs) -> int:
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]


# the dtype each bitsandbytes op multiplies in (4-bit weights are dequantised to A's dtype)
_BNB_DTYPE = {"int8_mixed_scaled_mm": "int8", "int8_scaled_mm": "int8",
              "int8_linear_matmul": "int8"}

# the dtype a matmul ran in -> the column of the peak FLOP/s table
PEAK_KEYS = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float8_e4m3fn: "fp8",
    torch.float8_e5m2: "fp8",
    torch.int8: "int8",
}


def flop_formulas() -> dict:
    """aten/custom op packet -> formula taking the op's real arguments (and ``out_val``).

    torch's registry, the attention kernels' (CPU ones added, grouped-query attention
    counted) and, once bitsandbytes has been imported (its ops exist only then), its
    matmul ops.
    """
    formulas = dict(flop_registry)  # registry entries already take tensors
    formulas.update({op: shape_wrapper(f) for op, f in ATTENTION_FLOPS.items()})
    if "bitsandbytes" in sys.modules:
        ops = torch.ops.bitsandbytes
        formulas.update({getattr(ops, name): shape_wrapper(f) for name, f in BNB_FLOPS.items()})
    if "engine.measure.nvfp4_linear" in sys.modules:  # emulated block-scaled GEMMs
        formulas[torch.ops.ampscope.emulated_mm] = shape_wrapper(_emulated_mm_flop)
    return formulas


def _data_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype a tensor's matmul runs in: a wrapper subclass's largest inner tensor.

    torchao's Float8TrainingTensor reports the dtype it was cast from (bf16) while its
    ``_data`` is float8 and its mm dispatches to torch._scaled_mm on that data; the other
    inner tensor is the (scalar or per-row) scale, so the largest one is the data.
    """
    if not is_traceable_wrapper_subclass(t):
        return t.dtype
    names, _ = t.__tensor_flatten__()
    inner = [getattr(t, name) for name in names]
    return _data_dtype(max(inner, key=torch.Tensor.numel)) if inner else t.dtype


def _block_scaled(t: torch.Tensor) -> str | None:
    """"mxfp8", "mxfp4" or "nvfp4" for torchao's block-scaled tensors (their matmul runs
    at the block-scaled rate, not fp8's), else None. Their qdata is float8 (MXFP8) or
    packed fp4, so the largest-inner-tensor rule would file MXFP8 under plain fp8."""
    mx = sys.modules.get("torchao.prototype.mx_formats.mx_tensor")
    if mx is not None and isinstance(t, mx.MXTensor):
        return "mxfp4" if t.elem_dtype == torch.float4_e2m1fn_x2 else "mxfp8"
    nv = sys.modules.get("torchao.prototype.mx_formats.nvfp4_tensor")
    if nv is not None and isinstance(t, nv.NVFP4Tensor):
        return "nvfp4"
    return None


def peak_key(op, args: tuple, tf32: bool = False) -> str:
    """The peak-table column of the dtype ``op`` multiplied in, from its arguments."""
    namespace, _, name = str(getattr(op, "_qualified_op_name", "")).partition("::")
    if namespace == "bitsandbytes" and name in _BNB_DTYPE:
        return _BNB_DTYPE[name]
    if namespace == "ampscope":  # an emulated GEMM: the format the card would run it in
        return str(args[2])
    leaves = torch.utils._pytree.tree_leaves(args)
    block = next((b for t in leaves if isinstance(t, torch.Tensor)
                  for b in [_block_scaled(t)] if b), None)
    if block:
        return block
    dtype = next((_data_dtype(t) for t in leaves if isinstance(t, torch.Tensor)), None)
    key = PEAK_KEYS.get(dtype, str(dtype).removeprefix("torch."))
    return "tf32" if key == "fp32" and tf32 else key


@dataclass(frozen=True)
class Counted:
    """Hardware FLOPs of one step: total, by aten op and by the peak column of their dtype."""

    total: int
    by_op: dict = field(default_factory=dict)
    by_peak_dtype: dict = field(default_factory=dict)


def count_flops(fn: Callable[[], None], tf32: bool = False) -> Counted:
    """Run ``fn`` (one forward + backward) under FlopCounterMode; hardware FLOPs."""
    counter, by_dtype = counting_mode(tf32)
    with counter:
        fn()
    return counted(counter, by_dtype)


def counting_mode(tf32: bool = False) -> tuple[FlopCounterMode, Counter]:
    """A FlopCounterMode and the per-dtype tally its formulas fill (``counted`` reads both).

    Every formula is wrapped to also note the dtype its op ran in, so the per-dtype split
    adds up to FlopCounterMode's own total. ``tf32`` files fp32 matmuls under "tf32".
    ampscope.Recorder enters it around a user's first step, which no function wraps.
    """
    by_dtype: Counter = Counter()

    def attributed(op, formula):
        def count(*args, out_val=None, **kwargs):
            flops = int(formula(*args, out_val=out_val, **kwargs))
            by_dtype[peak_key(op, args, tf32)] += flops
            return flops

        count._get_raw = True  # FlopCounterMode passes tensors, not shapes
        return count

    mapping = {op: attributed(op, f) for op, f in flop_formulas().items()}
    return _SameKernels(display=False, custom_mapping=mapping), by_dtype


class _SameKernels(FlopCounterMode):
    """FlopCounterMode that runs exactly the kernels the step runs without it.

    FlopCounterMode decomposes an op it has no formula for (``silu_backward`` in a backward
    pass): the decomposition computes other bits than the op's own CPU or CUDA kernel, so
    the counted step trained differently from the user's. Here such an op runs itself and
    its decomposition is counted on fake tensors. Its per-module tally is left out too: it
    hooks every module's inputs for backward, which changes the order gradients are summed
    in; only the global tally is read.
    """

    def __init__(self, **kw):
        super().__init__(**kw)
        self.mod_tracker = _GlobalOnly()

    def __enter__(self):
        self.flop_counts.clear()
        self.mode = _CountDecomposed(self)
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        done, self.mode = self.mode.__exit__(*exc), None
        return done


class _GlobalOnly:
    """Stands in for FlopCounterMode's ModuleTracker: every FLOP is filed under "Global"."""

    parents = ("Global",)


def _any_fake(tree) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._pytree import tree_leaves

    return any(isinstance(t, FakeTensor) or (isinstance(t, torch.Tensor) and t.is_meta)
               for t in tree_leaves(tree))


class _CountDecomposed(_FlopCounterMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (isinstance(func, torch._ops.OpOverload) and func not in self.counter.flop_registry
                and func is not torch.ops.prim.device.default  # as FlopCounterMode: no kernel
                and func.has_kernel_for_dispatch_key(
                    torch._C.DispatchKey.CompositeImplicitAutograd)
                and not _any_fake((args, kwargs))):  # a traced step (the plan) has no bits
            self._count_on_fakes(func, args, kwargs)
            return func(*args, **kwargs)
        return super().__torch_dispatch__(func, types, args, kwargs)

    def _count_on_fakes(self, func, args, kwargs) -> None:
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.utils._pytree import tree_map_only

        with FakeTensorMode(allow_non_fake_inputs=True) as fake:
            fargs, fkwargs = tree_map_only(torch.Tensor, fake.from_tensor, (args, kwargs))
            with self:
                func.decompose(*fargs, **fkwargs)


def counted(counter: FlopCounterMode, by_dtype: Counter) -> Counted:
    by_op = {str(op): int(n) for op, n in counter.get_flop_counts()["Global"].items()}
    return Counted(int(counter.get_total_flops()), by_op,
                   {k: v for k, v in sorted(by_dtype.items()) if v})


def matmul_param_counts(model: nn.Module) -> tuple[int, int]:
    """(total, trainable) weights that take part in matmuls: Linear and GPT-2 Conv1D.

    bitsandbytes layers subclass ``nn.Linear`` and keep ``in_features``/``out_features``
    while their storage is packed, so the logical size comes from those. peft LoRA
    wrappers are plain modules holding a base layer and two ``nn.Linear`` adapters, which
    are counted as they are met. A tied lm_head is an ``nn.Linear`` and counts here even
    though its weight is also the embedding table (a lookup, no matmul). A module applied
    several times per step (ALBERT-style layer sharing) is counted once.
    """
    total = trainable = 0
    for module in model.modules():
        if isinstance(module, nn.Linear):
            n = module.in_features * module.out_features
        elif isinstance(module, Conv1D):
            n = module.nx * module.nf
        else:
            continue
        total += n
        if module.weight.requires_grad:
            trainable += n
    return total, trainable


@dataclass(frozen=True)
class AttentionStack:
    """Attention layers that score each query token against ``kv_len`` keys.

    ``width`` is heads x head_dim of the queries (not the hidden size: Llama-style
    configs may set head_dim so that the two differ; grouped-query attention shares
    keys and values between heads but every query head still scores every key).
    """

    name: str
    layers: int
    kv_len: int
    width: int


def attention_stacks(model_dims: dict, seq_len: int) -> tuple[AttentionStack, ...]:
    """The attention layers of a model (``engine.models.load.dims``) at ``seq_len`` tokens.

    An encoder-decoder's decoder is fed ``seq_len`` tokens too (the labels), so its
    self- and cross-attention both score ``seq_len`` keys per query.
    """
    w, s = model_dims["attention_width"], seq_len
    if model_dims.get("encoder_decoder"):
        enc, dec = model_dims["encoder_layers"], model_dims["decoder_layers"]
        return (AttentionStack("encoder self-attention", enc, s, w),
                AttentionStack("decoder self-attention", dec, s, w),
                AttentionStack("decoder cross-attention", dec, s, w))
    return (AttentionStack("self-attention", model_dims["n_layers"], s, w),)


def model_flops(*, tokens: int, matmul_params: int, trainable_matmul_params: int,
                attention: tuple[AttentionStack, ...]) -> tuple[int, str]:
    """Model FLOPs of one step over ``tokens`` tokens, and the formula with its numbers.

    Each matmul weight costs 2 FLOPs per token forward, 2 for the input gradient and
    2 for its own gradient; a frozen weight (the LoRA base) skips the last 2. Attention
    adds QK^T and AV, 2·s·w FLOPs each per token and layer forward, and twice that
    backward: 12·L·s·w per token. Causal masking is ignored, as FlopCounterMode ignores
    it. An encoder-decoder's stacks each see ``tokens`` tokens (the decoder is fed as
    many as the encoder).
    """
    n, n_train, t = matmul_params, trainable_matmul_params, tokens
    attn = sum(12 * a.layers * a.kv_len * a.width * t for a in attention)
    total = 4 * n * t + 2 * n_train * t + attn
    terms = " + ".join(f"12·{a.layers}·{a.kv_len}·{a.width}·{t:,}" for a in attention)
    stacks = "; ".join(f"{a.name}: L = {a.layers}, s = {a.kv_len}, w = heads·head_dim = "
                       f"{a.width}" for a in attention)
    formula = (
        "4·N·T forward and input gradients + 2·N_trainable·T weight gradients"
        " + 12·L·s·w·T attention"
        f" = 4·{n:,}·{t:,} + 2·{n_train:,}·{t:,} + {terms or '0'} = {total:,} FLOPs"
        f" (N = {n:,} matmul weights, N_trainable = {n_train:,}, T = {t:,} tokens; {stacks})"
    )
    return total, formula


@dataclass(frozen=True)
class BlendedPeak:
    flops_per_s: float | None
    reason: str | None
    parts: tuple[dict, ...]  # per dtype: dtype, flops, share, peak_flops_per_s, source


def blended_peak(flops_by_peak_dtype: dict, peak_lookup_fn: Callable[[str], object]) -> BlendedPeak:
    """The peak FLOP/s of a step's dtype mix: total FLOPs over the time at each peak.

    ``peak_lookup_fn(dtype_key)`` returns an object with ``flops_per_s`` (None when
    unknown), ``source`` and ``reason`` (engine.measure.peaks.peak_flops bound to a device). One
    dtype gives that dtype's peak exactly.
    """
    total = sum(flops_by_peak_dtype.values())
    if total == 0:
        return BlendedPeak(None, "the step ran no op with a FLOP formula", ())
    parts, missing, seconds = [], [], 0.0
    for dtype, flops in flops_by_peak_dtype.items():
        found = peak_lookup_fn(dtype)
        peak = getattr(found, "flops_per_s", None)
        parts.append({
            "dtype": dtype, "flops": flops, "share": flops / total,
            "peak_flops_per_s": peak, "source": getattr(found, "source", None),
        })
        if peak:
            seconds += flops / peak
        else:
            missing.append(f"{dtype} ({getattr(found, 'reason', None) or 'no peak'})")
    if missing:
        return BlendedPeak(None, "no peak FLOP/s for " + "; ".join(missing), tuple(parts))
    return BlendedPeak(total / seconds, None, tuple(parts))


def describe_blend(peak: BlendedPeak) -> str | None:
    """One line naming the peak's dtype mix ("bf16 100%: ..." or a blend of several)."""
    if not peak.parts:
        return None
    if len(peak.parts) == 1:
        return peak.parts[0]["source"]
    mix = ", ".join(f"{p['dtype']} {100 * p['share']:.1f}%" for p in peak.parts)
    return f"blended by FLOPs per dtype ({mix}): " + "; ".join(
        str(p["source"]) for p in peak.parts)
