"""What ``rec.step(tokens=..., lr=...)`` accept: what users pass, read the way they mean it.

Each function returns ``(value, None)`` or ``(None, why it cannot be meant)``; the Recorder
warns once with the argument's name and records the step without it. Tensors stay on their
device (read one step late with the step's other scalars, no host sync here).
"""

from __future__ import annotations

import math
import numbers

import torch


def token_count(value) -> tuple[object, str | None]:
    """A step's token count: an int, a digit string, a whole finite float, a batch's
    ``torch.Size`` (its elements: ``tokens=x.shape`` is batch x sequence) or a one-element
    tensor (a mask's sum, kept on its device)."""
    if isinstance(value, torch.Size):
        return math.prod(value), None
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            return None, (f"got a tensor of shape {tuple(value.shape)}: pass one count "
                          "(attention_mask.sum() or input_ids.numel())")
        if value.is_complex():
            return None, "got a complex tensor: pass one count"
        return value.detach().reshape(()).clone(), None
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        if not text.isdigit():
            return None, f"got the text {value[:40]!r}, not a count"
        return int(text), None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None, f"got {type(value).__name__}, not a count"
    if not math.isfinite(value) or value < 0 or value != int(value):
        return None, f"got {value!r}, not a count of tokens"
    return int(value), None


def _one_lr(value) -> tuple[object, str | None]:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            return None, f"a tensor of shape {tuple(value.shape)}"
        return value.detach().reshape(()).clone(), None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None, type(value).__name__
    if not math.isfinite(value):
        return None, repr(value)
    return float(value), None


def learning_rates(value, groups: int | None) -> tuple[list | None, str | None]:
    """The lr of each parameter group: one number (every group's, as given), or one per
    group (``sched.get_last_lr()``'s list, a tuple, a 1-D tensor); ``groups``: how many
    parameter groups the optimizer has (None: unknown)."""
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.numel() > 1:
        value = list(value.detach().reshape(-1).unbind())
    if not isinstance(value, (list, tuple)):
        one, bad = _one_lr(value)
        return ([one], None) if bad is None else (None, f"got {bad}, not a learning rate")
    if not value:
        return None, "got an empty list: pass sched.get_last_lr() or one number"
    if groups is not None and len(value) != groups:
        return None, (f"got {len(value)} values but the optimizer has {groups} parameter "
                      f"group{'s' * (groups != 1)}: pass one lr per group "
                      "(sched.get_last_lr()) or one number")
    lrs = []
    for i, item in enumerate(value):
        one, bad = _one_lr(item)
        if bad is not None:
            return None, f"got {bad} at position {i}, not a learning rate"
        lrs.append(one)
    return lrs, None


def lr_differs(given: list, used: list) -> bool:
    """Whether the lrs passed differ from those the optimizer step used (values on the
    host only: a tensor is not read here)."""
    pairs = list(zip(given if len(given) == len(used) else given * len(used), used))
    return any(isinstance(a, float) and isinstance(b, (int, float)) and not math.isclose(
        a, float(b), rel_tol=1e-6, abs_tol=0.0) for a, b in pairs)
