"""Per-rank memory the strategy should need, beside what a rank measured.

DDP replicates: every rank holds all weights, gradients and optimizer state, plus a
gradient bucket copy for the all-reduce. FSDP2 divides weights, gradients and
optimizer state by the number of ranks (rounded up: shards are padded to equal size)
and holds, while a block computes, the root unit and that block all-gathered in the
parameter dtype. Activations follow the single-process model for this rank's batch.
"""

from __future__ import annotations

import math

from engine.core.events import RankMemory
from engine.distributed.recipes import DistRecipe
from engine.models.memory_model import optimizer_bytes_per_param

_CATEGORIES = ("sharded_params_bytes", "unsharded_params_bytes", "grads_bytes",
               "optimizer_bytes", "activations_bytes", "comm_buffers_bytes", "total_bytes")


def predict_rank_memory(rec: DistRecipe, optimizer: str, params: int, trainable: int,
                        buffers_bytes: int, world: int, root_params: int, largest_unit: int,
                        activations: int) -> RankMemory:
    w = rec.base.weight_dtype.itemsize
    opt = optimizer_bytes_per_param(optimizer, w)
    if rec.strategy == "ddp":
        parts = dict(sharded_params_bytes=params * w + buffers_bytes, unsharded_params_bytes=None,
                     grads_bytes=trainable * w, optimizer_bytes=int(trainable * opt),
                     activations_bytes=activations, comm_buffers_bytes=trainable * w)
        formula = (f"DDP: {w} B weights + {w} B grads + {opt:g} B optimizer per parameter on "
                   f"every rank, + {w} B gradient buckets; activations for this rank's batch")
    else:
        p = rec.param_dtype.itemsize
        parts = dict(sharded_params_bytes=math.ceil(params / world) * w + buffers_bytes,
                     unsharded_params_bytes=(root_params + largest_unit) * p,
                     grads_bytes=math.ceil(trainable / world) * w,
                     optimizer_bytes=int(math.ceil(trainable / world) * opt),
                     activations_bytes=activations, comm_buffers_bytes=None)
        formula = (f"FSDP2: ({w} B weights + {w} B grads + {opt:g} B optimizer) / {world} ranks "
                   f"per parameter; unsharded: root unit + largest block x {p} B; activations "
                   "for this rank's batch")
    total = sum(v for v in parts.values() if v is not None)
    return RankMemory(**parts, total_bytes=total, total_method="sum of predicted categories",
                      notes=formula)


def errors_pct(predicted: RankMemory, measured: RankMemory) -> dict:
    out = {}
    for name in _CATEGORIES:
        pred, meas = getattr(predicted, name), getattr(measured, name)
        if pred is not None and meas:
            out[name.removesuffix("_bytes")] = 100.0 * (pred - meas) / meas
    return out
