"""Bytes a training step moves through device memory, for the roofline's memory bound.

FlopCounterMode counts FLOPs, not bytes. ``ByteCounter`` is a ``TorchDispatchMode`` that
adds, for every aten op that runs, the bytes of each tensor it reads (its tensor
arguments) and writes (its tensor results): the usual roofline approximation, in which
every op reads its inputs from and writes its outputs to DRAM once. Views and bare
allocations move nothing and are skipped; an in-place op counts its operand twice (read,
then written). What it does not see: cache reuse and kernel fusion (which move less) and
a kernel's own scratch traffic (which moves more). On fake tensors it counts shapes, so
nothing is allocated.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

CONVENTION = ("bytes moved: every aten op's tensor inputs read once and outputs written "
              "once (views and bare allocations move nothing), cache reuse and fusion "
              "ignored")
# A compiled graph fuses pointwise ops and reductions into their neighbours, so only the
# ops a compiler hands to a library kernel must read and write their operands in DRAM.
FUSED_CONVENTION = ("bytes moved, fused (a compiled step): only matmuls, attention, "
                    "embeddings and the optimizer's foreach ops read their inputs and write "
                    "their outputs once; pointwise ops and reductions, fused into them, move "
                    "nothing: the least traffic the step can have")
# name prefixes of aten ops that stay library kernels (or eager) under torch.compile
_UNFUSED = ("mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "_int_mm", "_scaled_dot_product",
            "_flash_attention", "_efficient_attention", "_cudnn_attention", "embedding",
            "_foreach_", "_amp_foreach", "_fused_adam", "_fused_sgd")
_aten = torch.ops.aten
# allocations whose contents nothing writes yet
_ALLOCATIONS = {_aten.empty.memory_format, _aten.empty_strided.default,
                _aten.empty_like.default, _aten.new_empty.default,
                _aten.new_empty_strided.default}


def tensor_bytes(tensor: torch.Tensor) -> int:
    """The bytes an op touches in ``tensor``: its elements, or a wrapper subclass's inner
    tensors (a float8 tensor's 1-byte data and its scale, not its outer dtype's size)."""
    if is_traceable_wrapper_subclass(tensor):
        names, _ = tensor.__tensor_flatten__()
        inner = (getattr(tensor, n) for n in names)
        return sum(tensor_bytes(t) for t in inner if isinstance(t, torch.Tensor))
    return tensor.numel() * tensor.element_size()


class ByteCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.bytes_moved = 0  # CONVENTION
        self.bytes_moved_fused = 0  # FUSED_CONVENTION

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not (func.is_view or func in _ALLOCATIONS):
            moved = tree_leaves((args, kwargs or {}, out))
            count = sum(tensor_bytes(t) for t in moved if isinstance(t, torch.Tensor))
            self.bytes_moved += count
            if func.__name__.split(".")[0].startswith(_UNFUSED):
                self.bytes_moved_fused += count
        return out
