"""The precision a recorded run really trained in, read from its steps (DESIGN.md 26).

Autocast's state and dtype are read inside the first training forward: at the model's
forward pre-hook, and, where autocast is entered inside the model's forward (accelerate
wraps ``model.forward`` in it, so the Trainer's autocast starts there), at the first
submodule with parameters. The counting step's FLOPs by dtype confirm it: a half-precision
majority of matmul FLOPs over fp32 weights is autocast too. The scaler counts when one is
present and enabled; the weights' dtype is the first parameter's.
"""

from __future__ import annotations

import torch

_HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


class AutocastProbe:
    """Reads autocast inside the model's first training forward (``seen(dtype or None)``
    once), then removes itself."""

    def __init__(self, model: torch.nn.Module, device_type: str, seen) -> None:
        self._device_type, self._seen = device_type, seen
        self._handle = None
        if torch.is_autocast_enabled(device_type):  # entered around the model's call
            seen(torch.get_autocast_dtype(device_type))
            return
        inner = next((m for m in model.modules() if m is not model
                      and next(m.parameters(recurse=False), None) is not None), None)
        if inner is None:
            seen(None)
            return
        self._handle = inner.register_forward_pre_hook(self._inside)

    def _inside(self, module, args) -> None:
        self.remove()
        enabled = torch.is_autocast_enabled(self._device_type)
        self._seen(torch.get_autocast_dtype(self._device_type) if enabled else None)

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def matmul_dtype(by_peak_dtype: dict) -> torch.dtype | None:
    """Half precision that most counted matmul FLOPs ran in, else None."""
    if not by_peak_dtype:
        return None
    return _HALF.get(max(by_peak_dtype, key=by_peak_dtype.get))


def precision(weights: torch.dtype, autocast: torch.dtype | None, scaled: bool,
              tf32: bool) -> str:
    """AmpScope's precision name for what ran."""
    if weights == torch.float16:
        return "fp16"
    if weights == torch.bfloat16:
        return "bf16"
    if autocast == torch.float16 or scaled:
        return "fp16-amp"
    if autocast == torch.bfloat16:
        return "bf16-amp"
    return "tf32" if tf32 else "fp32"


def describe(who: str, weights: torch.dtype | None, autocast: torch.dtype | None,
             counted: torch.dtype | None, scaled: bool, optimizer: str,
             details: str | None = None) -> str:
    """The recipe as it ran: ``autocast`` seen in the forward, else ``counted`` (the
    dtype most counted matmul FLOPs ran in)."""
    amp = (f"autocast {_name(autocast)}" if autocast is not None else
           f"autocast {_name(counted)} (found from the dtype of the matmuls counted: "
           "entered inside the model's forward)" if counted is not None else "no autocast")
    text = (f"{who}: {_name(weights) if weights is not None else 'no'} weights, {amp}, "
            f"{'GradScaler' if scaled else 'no loss scaling'}, optimizer {optimizer}")
    return f"{text}, {details}" if details else text


def tf32_matmuls() -> bool:
    """Whether cuBLAS runs fp32 matmuls as TF32, read through the ``fp32_precision`` API.

    The legacy ``torch.backends.cuda.matmul.allow_tf32`` raises once the new API was set
    (transformers' ``TrainingArguments(tf32=True)`` sets ``torch.backends.fp32_precision``),
    while the new one also reflects the legacy flag and ``set_float32_matmul_precision``.
    """
    mode = torch.backends.cuda.matmul.fp32_precision
    if mode == "none":  # the matmul backend inherits the global setting
        mode = torch.backends.fp32_precision
    return mode == "tf32"
