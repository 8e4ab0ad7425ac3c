"""CUDA's autocast policy, applied to a trace that runs on the CPU device.

A CPU build of torch has fake CUDA tensors but cannot build an autograd graph on them (its
autograd engine asks for a CUDA stream guard, which the build does not link), and
``torch.autocast("cuda")`` turns itself off without CUDA. The plan's trace therefore runs on
the CPU device under CPU autocast (its region, its cache of cast weights and the recompute
of checkpointed layers follow it), and ``CudaAutocast``, a ``TorchFunctionMode`` above
autograd, makes each call cast as CUDA autocast casts it: what the casts leave alive for
backward is what the card keeps (CUDA runs ``pow``, ``exp``, ``layer_norm``, ``softmax``...
in fp32, where CPU autocast runs them in the input's dtype).

The op lists are CUDA's from torch's ``aten/src/ATen/autocast_mode.cpp``
(``TORCH_LIBRARY_IMPL(aten, AutocastCUDA, m)``), as the AMP docs list them ("CUDA Ops that
can autocast to float16 / to float32 / promote to the widest input type"); tests check
them against the AutocastCUDA kernels registered in the installed build. A call is matched
by its Python name (``torch.pow``, ``Tensor.__pow__``, ``F.layer_norm``), so an op that a
composite C++ op calls inside itself is cast as its caller is (``F.cross_entropy`` as
CUDA's ``log_softmax`` and ``nll_loss``: fp32).
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager, nullcontext
from functools import cache, partial

import torch
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack
from torch.utils._pytree import tree_map

# autocast_mode.cpp, AutocastCUDA: lower_precision_fp (cast to the autocast dtype)
LOWER = frozenset({
    "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "convolution", "cudnn_convolution",
    "cudnn_convolution_transpose", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm",
    "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
    "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell",
    "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention",
    "scaled_dot_product_attention"})
# fp32 (cast floating inputs to float32); binary_cross_entropy is banned under CUDA
# autocast (it raises there), kept here as the fp32 op it is on the CPU
FP32 = frozenset({
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow", "softplus", "layer_norm", "native_layer_norm",
    "group_norm", "rms_norm", "frobenius_norm", "nuclear_norm", "norm", "cosine_similarity",
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
    "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
    "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa"})
# fp32_set_opt_dtype: run with dtype=float32 unless the call names a dtype (the output is
# float32, the input is not copied)
FP32_OUTPUT = frozenset({"prod", "softmax", "log_softmax", "cumprod", "cumsum",
                         "linalg_vector_norm", "linalg_matrix_norm", "sum"})
# promote: cast floating inputs to the widest floating dtype among them
PROMOTE = frozenset({"addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot",
                     "grid_sampler", "index_put", "scatter_add", "tensordot"})
# Python names of the calls whose aten op, or the ops it is made of, CUDA lists
ALIASES = {"cross_entropy": "nll_loss", "vector_norm": "linalg_vector_norm",
           "matrix_norm": "linalg_matrix_norm", "multi_dot": "linalg_multi_dot",
           "vecdot": "linalg_vecdot", "interpolate": "upsample_nearest2d"}

POLICY = ("CUDA's autocast op lists (torch's AutocastCUDA kernels, autocast_mode.cpp), applied "
          "on the CPU trace by engine.run.plan_autocast")
CPU_POLICY = "the CPU's autocast op lists (AutocastCPU), as a CPU trial runs"


def _name(func) -> str:
    name = getattr(func, "__name__", "")
    if name.startswith("__") and name.endswith("__"):  # Tensor.__pow__, __rpow__, __matmul__
        name = name[2:-2]
        name = name[1:] if name in ("rpow", "rmatmul") else name
    return ALIASES.get(name, name)


def _floating(t) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


def _call_cast(func, args, kwargs, dtype):
    """``func`` with its floating tensor arguments cast to ``dtype`` (no copy where equal)."""
    def one(t):
        return t.to(dtype) if _floating(t) else t

    return func(*tree_map(one, args), **tree_map(one, kwargs))


@cache  # the build's registrations do not change within a process
def _cpu_categories() -> frozenset:
    """Ops the installed build's CPU autocast casts (AutocastCPU kernels), by base name."""
    names = torch._C._dispatch_get_all_op_names()
    return frozenset(op.split("::")[1].split(".")[0] for op in names
                     if torch._C._dispatch_has_kernel_for_dispatch_key(op, "AutocastCPU"))


class CudaAutocast(TorchFunctionMode):
    """Cast each call as CUDA autocast would while CPU autocast is on (in the recipe's
    region or a checkpointed layer's recompute); outside it, calls run as they are."""

    def __init__(self):
        super().__init__()
        self.cpu = _cpu_categories()
        self.cpu_only = self.cpu - LOWER - FP32 - FP32_OUTPUT - PROMOTE

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not torch.is_autocast_enabled("cpu"):
            return func(*args, **kwargs)
        name = _name(func)
        if name in LOWER:
            if name in self.cpu:  # CPU autocast lowers it too, and caches the weights' casts
                return func(*args, **kwargs)
            # ones it does not list (einsum, mv, addmv, addr...) are cast here
            return _call_cast(func, args, kwargs, torch.get_autocast_dtype("cpu"))
        if name in FP32:
            return _call_cast(func, args, kwargs, torch.float32)
        if name in FP32_OUTPUT:
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            named = kwargs.get("dtype") is not None or any(isinstance(a, torch.dtype)
                                                            for a in args)
            if _floating(first) and not named:
                kwargs = {**kwargs, "dtype": torch.float32}
            return func(*args, **kwargs)
        if name in PROMOTE:
            dtypes = [t.dtype for t in (*args, *kwargs.values()) if _floating(t)]
            if dtypes:
                widest = max(dtypes, key=lambda d: torch.finfo(d).bits)
                return _call_cast(func, args, kwargs, widest)
            return func(*args, **kwargs)
        if name in self.cpu_only:  # CPU autocast casts these, CUDA's runs them as given
            with torch.autocast("cpu", enabled=False):
                return func(*args, **kwargs)
        return func(*args, **kwargs)


ATTENTION = ("SDPA as a CUDA card runs it: a fused kernel (flash or memory-efficient) that "
             "keeps the output and its log-sum-exp for backward, with attention dropout too")


class CudaAttention(TorchFunctionMode):
    """SDPA with dropout as CUDA's fused kernels run it.

    CUDA's flash and memory-efficient kernels apply attention dropout inside the kernel
    (backward replays it from the RNG seed and offset), so what they keep for backward does
    not depend on ``dropout_p``. The CPU's fused kernel takes no dropout: with it, SDPA on
    the CPU falls back to its math path, which keeps the attention matrix and the dropout
    mask (batch x heads x tokens^2 each). The trace therefore runs SDPA without dropout,
    which takes the CPU's fused kernel and keeps what the card's keeps (less the seed and
    offset, two scalars)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            if len(args) > 4:  # query, key, value, attn_mask, dropout_p
                args = (*args[:4], 0.0, *args[5:])
            kwargs = {**kwargs, "dropout_p": 0.0} if "dropout_p" in kwargs else kwargs
        return func(*args, **kwargs)


def recompute_as_traced(model, casts: bool, attention: bool) -> None:
    """Let checkpointed layers recompute under the same modes as their forward. torch runs a
    recompute with Python function modes off, so the modes entered around the traced step
    do not reach it (its tensors then came out in the CPU's dtypes and checkpoint refused
    them); checkpoint's ``context_fn`` enters fresh ones around each recompute, or, for the
    reentrant checkpoint (peft's, on a quantised model), the recomputed function does."""
    if not (casts or attention):
        return

    @contextmanager
    def modes():  # entered when the recompute runs (context_fn is called in forward)
        with ExitStack() as stack:
            if casts:
                stack.enter_context(CudaAutocast())
            if attention:
                stack.enter_context(CudaAttention())
            yield

    def recompute_modes():
        return nullcontext(), modes()

    for module in model.modules():
        checkpointed = getattr(module, "_gradient_checkpointing_func", None)
        if checkpointed is None:
            continue
        if getattr(checkpointed, "keywords", {}).get("use_reentrant", True):
            # peft's preparation of a quantised model asks for the reentrant checkpoint,
            # which takes no context_fn: the function it recomputes enters the modes
            module._gradient_checkpointing_func = partial(_reentrant, checkpointed, modes)
        else:  # transformers' partial(checkpoint, use_reentrant=False)
            module._gradient_checkpointing_func = partial(checkpointed,
                                                          context_fn=recompute_modes)


def _reentrant(checkpointed, modes, function, *args, **kwargs):
    """A reentrant checkpoint of ``function`` whose recompute (in an autograd Function's
    backward, where Python function modes are off) runs under fresh ``modes``; its
    forward, under the step's own modes, runs as it is."""
    ours = (CudaAutocast, CudaAttention)

    def run(*a, **k):
        if any(isinstance(m, ours) for m in _get_current_function_mode_stack()):
            return function(*a, **k)
        with modes():
            return function(*a, **k)

    return checkpointed(run, *args, **kwargs)
