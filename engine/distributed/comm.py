"""Bytes each collective carries, counted from the ``c10d`` ops actually dispatched.

Convention: a collective's bytes are its *payload*, the largest buffer it touches:
the tensor of an all-reduce, the gathered (output) tensor of an all-gather, the full
(input) tensor of a reduce-scatter. That is the "size" nccl-tests reports; the bytes
a rank puts on the wire are a ring's 2(n-1)/n (all-reduce) or (n-1)/n of it.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.distributed.recipes import DistRecipe, dtype_name

# substrings of c10d op names -> the collective they issue
_KINDS = (("reduce_scatter", "reduce_scatter"), ("allgather", "all_gather"),
          ("all_gather", "all_gather"), ("allreduce", "all_reduce"),
          ("all_reduce", "all_reduce"), ("broadcast", "broadcast"))


def _kind(func) -> str | None:
    if "c10d" not in func.namespace:
        return None
    name = func.overloadpacket.__name__
    return next((kind for key, kind in _KINDS if key in name), name.strip("_"))


def _tensors(obj, out: list) -> list:
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _tensors(item, out)
    return out


class CommCounter(TorchDispatchMode):
    """Counts payload bytes by (collective, dtype) while active; ``bytes`` accumulates."""

    def __init__(self):
        super().__init__()
        self.bytes: Counter = Counter()
        self.calls: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kind = _kind(func)
        if kind is not None:
            tensors = _tensors(args, [])
            if tensors:
                big = max(tensors, key=lambda t: t.numel() * t.element_size())
                key = f"{kind}:{str(big.dtype).removeprefix('torch.')}"
                self.bytes[key] += big.numel() * big.element_size()
                self.calls[key] += 1
        return func(*args, **(kwargs or {}))


def _dt(name: str) -> str:
    return {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[name]


def expected_bytes(rec: DistRecipe, trainable_params: int, unit_params: list[tuple[int, bool]],
                   grad_accum: int) -> tuple[dict, str]:
    """Payload bytes per optimiser step the recipe implies, keyed like ``CommCounter``.

    ``unit_params``: (parameters, resharded after forward) per FSDP2 unit. Gradients
    are synchronised once per step (no_sync / set_requires_gradient_sync on earlier
    micro-batches); FSDP2 all-gathers every unit per micro-batch in forward, and again
    in backward those units it resharded after forward.
    """
    size = {"fp32": 4, "bf16": 2, "fp16": 2}
    if rec.strategy == "ddp":
        red = dtype_name(rec.reduce_dtype)
        return ({f"all_reduce:{_dt(red)}": trainable_params * size[red]},
                f"trainable parameters x {size[red]} B ({red}), one all-reduce of all "
                "gradient buckets per step")
    par, red = dtype_name(rec.param_dtype), dtype_name(rec.reduce_dtype)
    gathered = sum(n * (2 if again else 1) for n, again in unit_params)
    total = sum(n for n, _ in unit_params)
    expected = {f"all_gather:{_dt(par)}": gathered * size[par] * grad_accum,
                f"reduce_scatter:{_dt(red)}": total * size[red]}
    formula = (f"all-gather: each unit's parameters x {size[par]} B ({par}) per micro-batch, "
               f"twice for units resharded after forward; reduce-scatter: all parameters x "
               f"{size[red]} B ({red}) per step; shard padding not counted")
    if rec.use_scaler:  # ShardedGradScaler agrees on found-inf across ranks
        expected["all_reduce:float32"] = 4
        formula += "; the sharded GradScaler's found-inf flag: one fp32 all-reduce"
    return expected, formula
