"""Which float8 scalings this torch's CPU ``torch._scaled_mm`` takes.

torchao's float8 recipes run their GEMMs through ``torch._scaled_mm``. On the CPU, torch
2.11's kernel takes per-tensor scales only (one scale per operand) and rejects the rowwise
ones (one per row of A, one per column of B) that fp8-rowwise and fp8-rowwise-gw-hp need;
later torch takes both. The kernel is asked once with a 16 x 16 product, so the answer is
the feature's, not a version number's.
"""

from __future__ import annotations

import functools

import torch

from engine.core.config import PRECISIONS
from engine.core.recipes import recipe

_ROWWISE = ("rowwise", "rowwise_with_gw_hp")  # Recipe.float8_recipe values with row scales


@functools.cache
def rowwise_scaled_mm_error() -> str | None:
    """None where the CPU ``torch._scaled_mm`` takes rowwise scales, else torch's words why
    not (the last sentence of its error: the rest is the C++ assertion)."""
    n = 16
    a = torch.ones(n, n).to(torch.float8_e4m3fn)
    b = torch.ones(n, n).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
    try:
        torch._scaled_mm(a, b, scale_a=torch.ones(n, 1), scale_b=torch.ones(1, n),
                         out_dtype=torch.bfloat16)
    except RuntimeError as exc:
        words = [s.strip() for s in str(exc).strip().splitlines()[0].split(". ") if s.strip()]
        return words[-1].rstrip(".") if words else type(exc).__name__
    return None


def unsupported_on_cpu() -> dict[str, str]:
    """Precision -> why it cannot run on this torch's CPU, for the rowwise float8 recipes
    where the CPU ``_scaled_mm`` rejects row scales; empty where it takes them."""
    error = rowwise_scaled_mm_error()
    if error is None:
        return {}
    why = (f"n/a on the CPU: torch {torch.__version__}'s CPU torch._scaled_mm takes "
           f"per-tensor scales only (\"{error}\"), and this recipe's float8 GEMMs need one "
           "scale per row: choose fp8 (tensorwise), a GPU with fp8 (compute capability 8.9+) "
           "or torch 2.13, whose CPU _scaled_mm takes row scales")
    return {p: why for p in PRECISIONS if recipe(p).float8_recipe in _ROWWISE}
