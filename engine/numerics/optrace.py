"""Which dtype each aten op really ran in during one training step, and its FLOPs.

A ``TorchDispatchMode`` sees every aten op below autocast and autograd, forward and
backward, with the tensors it got and returned. FLOPs come from torch's own formula
registry (the one ``FlopCounterMode`` uses) plus engine.measure.flops' attention and
bitsandbytes formulas. From the FLOPs per compute dtype follows the peak a step can reach
(``engine.measure.flops.blended_peak``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from engine.core.recipes import Recipe, fp32_precision
from engine.measure.flops import flop_formulas, peak_key
from engine.numerics.step import forward_loss
from engine.record.lab_results import GemmFlag, OpStat, OpTrace

GEMM_OPS = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_mm")
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# ops that mixed precision keeps in fp32 for accuracy; the trace shows what they returned
# names of ops that do matrix math; one without a FLOP formula leaves FLOPs uncounted
_HEAVY_WORDS = ("mm", "matmul", "linear", "attention", "conv")
PRECISION_SENSITIVE = ("softmax", "log_softmax", "layer_norm", "rms_norm", "nll_loss",
                       "cross_entropy", "group_norm", "batch_norm", "mse_loss")


def gemm_dims(name: str, args: tuple) -> tuple[int, int, int] | None:
    """(M, N, K) of a GEMM from its aten arguments, batch dimensions left out."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if name in ("addmm", "baddbmm"):
        tensors = tensors[1:]  # the first is the added input
    if len(tensors) < 2 or tensors[0].dim() < 2 or tensors[1].dim() < 2:
        return None
    a, b = tensors[0], tensors[1]
    return int(a.shape[-2]), int(b.shape[-1]), int(a.shape[-1])


def _dtypes(tree) -> tuple[str, ...]:
    seen = dict.fromkeys(str(t.dtype) for t in tree_leaves(tree) if isinstance(t, torch.Tensor))
    return tuple(seen)


class _Tracer(TorchDispatchMode):
    def __init__(self, tf32: bool):
        super().__init__()
        self.tf32 = tf32
        self.phase = "forward"
        self.stats: dict[tuple[str, str], dict] = {}
        self.by_peak: dict[str, int] = {}
        self.flags: dict[tuple, GemmFlag] = {}
        self.uncounted: set[str] = set()
        self.formulas = flop_formulas()  # the ones engine.measure.flops' FlopCounterMode uses

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func)
        packet = func._overloadpacket
        key = (name, self.phase, _dtypes((args, kwargs)), _dtypes(out))
        entry = self.stats.setdefault(key, {"count": 0, "flops": 0})
        entry["count"] += 1
        if packet in self.formulas:
            flops = int(self.formulas[packet](*args, **kwargs, out_val=out))
            entry["flops"] += flops
            key = peak_key(packet, args, self.tf32)
            self.by_peak[key] = self.by_peak.get(key, 0) + flops
        elif any(word in packet.__name__ for word in _HEAVY_WORDS):
            self.uncounted.add(name)
        short = packet.__name__
        if short in GEMM_OPS:
            self._check_gemm(name, short, args)
        return out

    def _check_gemm(self, name: str, short: str, args: tuple) -> None:
        dims = gemm_dims(short, args)
        if dims is None:
            return
        dtype = next(t.dtype for t in args if isinstance(t, torch.Tensor))
        multiple = 16 if dtype in FP8_DTYPES else 8
        odd = [f"{label}={v}" for label, v in zip("MNK", dims) if v % multiple]
        if odd and (name, self.phase, dims, dtype) not in self.flags:
            self.flags[(name, self.phase, dims, dtype)] = GemmFlag(
                op=name, phase=self.phase, m=dims[0], n=dims[1], k=dims[2], dtype=str(dtype),
                multiple=multiple,
                reason=f"{', '.join(odd)} not a multiple of {multiple}: cannot use Tensor "
                       "Cores at full speed (padding or a slower kernel)",
            )


def trace_ops(model: nn.Module, batch: dict, recipe: Recipe,
              device: torch.device | str) -> OpTrace:
    """Trace one forward and backward of ``model`` on ``batch`` under ``recipe``."""
    device = torch.device(device)
    tracer = _Tracer(tf32=recipe.tf32 and device.type == "cuda")
    model.zero_grad(set_to_none=True)
    with fp32_precision(recipe), tracer:
        loss = forward_loss(model, batch, recipe, device)
        tracer.phase = "backward"
        loss.backward()
    model.zero_grad(set_to_none=True)
    total = sum(e["flops"] for e in tracer.stats.values())
    ops = [
        OpStat(
            op=name, phase=phase, count=e["count"], input_dtypes=ins, output_dtypes=outs,
            flops=e["flops"], flops_share=e["flops"] / total if total else None,
            precision_sensitive=any(s in name for s in PRECISION_SENSITIVE),
        )
        for (name, phase, ins, outs), e in tracer.stats.items()
    ]
    ops.sort(key=lambda s: (-s.flops, s.phase != "forward", s.op))
    return OpTrace(
        ops=tuple(ops),
        total_flops=total,
        flops_by_peak_dtype=dict(sorted(tracer.by_peak.items())),
        flagged_gemms=tuple(tracer.flags.values()),
        uncounted_ops=tuple(sorted(tracer.uncounted)),
    )
