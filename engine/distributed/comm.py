"""Bytes each collective carries, counted from the ``c10d`` ops actually dispatched.

Convention: a collective's bytes are its *payload*, the largest buffer it touches:
the tensor of an all-reduce, the gathered (output) tensor of an all-gather, the full
(input) tensor of a reduce-scatter. That is the "size" nccl-tests reports; the bytes
a rank puts on the wire are a ring's 2(n-1)/n (all-reduce) or (n-1)/n of it.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from engine.distributed.recipes import DistRecipe, dtype_name

# substrings of c10d op names -> the collective they issue
_KINDS = (("reduce_scatter", "reduce_scatter"), ("allgather", "all_gather"),
          ("all_gather", "all_gather"), ("allreduce", "all_reduce"),
          ("all_reduce", "all_reduce"), ("broadcast", "broadcast"))
# functional-collective ops that move nothing: waiting on a result, wrapping it for autograd
_NOT_COLLECTIVES = ("wait_tensor", "wrap_tensor_autograd")


def _kind(func) -> str | None:
    if "c10d" not in func.namespace:
        return None
    name = func.overloadpacket.__name__
    if name.strip("_") in _NOT_COLLECTIVES:
        return None
    return next((kind for key, kind in _KINDS if key in name), name.strip("_"))


def _tensors(obj, out: list) -> list:
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _tensors(item, out)
    return out


class CommCounter(TorchDispatchMode):
    """Counts payload bytes by (collective, dtype) while active; ``bytes`` accumulates.

    ``through_dtensor``: a mode sees a DTensor op before DTensor turns it into local ops
    and collectives, so those collectives pass unseen; with it on, the op is handed back
    (NotImplemented, as torch's CommDebugMode does) and they are counted. Used for torchao's
    float8 scale precompute, which all-reduces through a DTensor op.
    """

    def __init__(self, through_dtensor: bool = False):
        super().__init__()
        self.bytes: Counter = Counter()
        self.calls: Counter = Counter()
        self.through_dtensor = through_dtensor

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.through_dtensor and any(issubclass(t, DTensor) for t in types):
            return NotImplemented
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
                   grad_accum: int, float8_units: list[tuple[int, int]] | None = None
                   ) -> tuple[dict, str]:
    """Payload bytes per optimiser step the recipe implies, keyed like ``CommCounter``.

    ``unit_params``: (parameters, resharded after forward) per FSDP2 unit. Gradients
    are synchronised once per step (no_sync / set_requires_gradient_sync on earlier
    micro-batches); FSDP2 all-gathers every unit per micro-batch in forward, and again
    in backward those units it resharded after forward. ``float8_units``: (float8 Linear
    weight elements, float8 Linear layers) per unit, for the float8 all-gather recipe.
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
    if rec.base.fsdp_float8_all_gather:
        # torchao casts each float8 weight shard to float8 before FSDP2 gathers the unit;
        # a unit that mixes dtypes is gathered as one uint8 buffer, the others as before
        wire = Counter()
        for (n, again), (f8, _) in zip(unit_params, float8_units):
            key = "all_gather:uint8" if f8 else f"all_gather:{_dt(par)}"
            wire[key] += ((n - f8) * size[par] + f8) * (2 if again else 1) * grad_accum
        layers = sum(k for _, k in float8_units)
        del expected[f"all_gather:{_dt(par)}"]
        expected.update({k: v for k, v in wire.items() if v})
        expected["all_reduce:float32"] = 4 * layers
        formula = (f"all-gather: float8 Linear weights x 1 B (fp8) and the other parameters x "
                   f"{size[par]} B ({par}) per micro-batch, twice for units resharded after "
                   f"forward, as one uint8 buffer in units with float8 weights; the scale "
                   f"precompute: one all-reduce of each float8 weight's fp32 amax (4 B x "
                   f"{layers} layers) per step; reduce-scatter: all parameters x {size[red]} B "
                   f"({red}) per step; shard padding not counted")
    if rec.use_scaler:  # ShardedGradScaler agrees on found-inf across ranks
        expected["all_reduce:float32"] = 4
        formula += "; the sharded GradScaler's found-inf flag: one fp32 all-reduce"
    return expected, formula
