"""The optimiser a trial, a rank or the plan builds by its name, Adam's epsilon for the
trained weights' dtype, and why an optimiser cannot run on a device."""

from __future__ import annotations

import torch

from engine.core.config import TORCHAO_STEP


def adam_eps(params: list) -> float:
    """Adam's epsilon, raised where the default would round to zero in a trainable dtype.

    In pure fp16, 1e-8 becomes 0, and a parameter whose gradient was 0 so far then
    divides 0 by 0: NaN weights after one step. The smallest normal value of the least
    precise trainable dtype is the least epsilon that survives. Only the trained weights
    matter: a frozen fp16 base (int8, nf4) with fp32 LoRA adapters keeps 1e-8.
    """
    default = 1e-8
    dtype = trainable_dtype(params)
    if dtype is not None and torch.tensor(default, dtype=dtype).item() == 0.0:
        return float(torch.finfo(dtype).tiny)
    return default


def trainable_dtype(params: list) -> torch.dtype | None:
    """The floating dtype of ``params`` with the smallest normal range (None if none)."""
    floats = {p.dtype for p in params if p.dtype.is_floating_point}
    return max(floats, key=lambda d: torch.finfo(d).tiny, default=None)


def make_optimizer(name: str, params: list, lr: float, eps: float = 1e-8,
                   fused: bool = False):
    """``fused`` (CUDA): one kernel per step, and a GradScaler hands it the inf check as a
    tensor; the default foreach AdamW makes ``GradScaler.step`` call ``.item()`` mid-step,
    which would slow the scaled (fp16) recipes only."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, fused=fused or None)
    if name == "adamw8bit":
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(params, lr=lr, eps=eps)
    if name in _TORCHAO_OPTIMIZERS:
        import torchao.optim

        # torchao's AdamWs default to weight_decay=1e-2 as torch's AdamW does
        return getattr(torchao.optim, _TORCHAO_OPTIMIZERS[name])(params, lr=lr, eps=eps)
    if name == "adamw-bf16-sr":
        return _bf16_state_adamw()(params, lr=lr, eps=eps, bf16_stochastic_round=True)
    return torch.optim.AdamW(params, lr=lr, eps=eps, fused=fused or None)


_TORCHAO_OPTIMIZERS = {"adamw8bit-ao": "AdamW8bit", "adamw4bit": "AdamW4bit",
                       "adamw-fp8": "AdamWFp8"}


def _bf16_state_adamw():
    """torchao's ``_AdamW`` keeps m and v in the weight's dtype (fp32 under AMP); this one
    keeps them in bf16 for every weight. Its step computes in fp32 and stochastically rounds
    bf16 weights (torchao 0.18 ``single_param_adam``); the state is rounded to nearest."""
    from torchao.optim import _AdamW

    class AdamWBf16State(_AdamW):
        def _new_buffer(self, p, signed):
            return torch.zeros_like(p, dtype=torch.bfloat16)

    return AdamWBf16State


def optimizer_reason(name: str, device_type: str) -> str | None:
    """Why a trial's optimiser cannot run on this device, or None. torchao's optimisers
    compile every step with torch.compile(fullgraph=True): inductor needs a C++ compiler
    on the CPU and Triton on a GPU."""
    if name not in TORCHAO_STEP:
        return None
    try:
        import torchao.optim  # noqa: F401
    except Exception as exc:
        return f"torchao's optimizers cannot load ({type(exc).__name__}: {exc})"
    if device_type == "cuda":
        from torch.utils._triton import has_triton

        return None if has_triton() else (
            f"{name} compiles its step with torch.compile, which needs Triton on a GPU: "
            "pip install triton")
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        get_cpp_compiler()
    except Exception as exc:
        return (f"{name} compiles its step with torch.compile, which needs a C++ compiler on "
                f"the CPU ({exc}): install g++")
    return None
