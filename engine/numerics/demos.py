"""Small experiments that show why each precision behaves as it does, run on the device.

Each demo computes on the chosen device and reads the result back, so the table is what
this hardware and this torch build do (CPU autocast, for one, keeps a different fp32
list from CUDA autocast).
"""

from __future__ import annotations

import math

import torch

from engine.numerics.formats import float_format
from engine.record.lab_results import DemoResult

FLOATS = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _half_ulp_at_one(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


def one_plus_small(device: torch.device) -> list[DemoResult]:
    """1 + d: an update below half the spacing at 1.0 rounds back to 1.0."""
    out = []
    for label, delta in (("2**-12", 2.0**-12), ("0.0001", 1e-4), ("0.001", 1e-3)):
        for name, dtype in FLOATS.items():
            one = torch.tensor(1.0, dtype=dtype, device=device)
            d = torch.tensor(delta, dtype=dtype, device=device)
            value = (one + d).item()
            kept = value != 1.0
            half = _half_ulp_at_one(dtype)
            out.append(DemoResult(
                name="one_plus_small",
                expression=f"1 + {label}",
                dtype=name,
                result=value,
                expected_exact=1.0 + delta,
                verdict="kept" if kept else "swallowed",
                explanation=(
                    f"{name} spacing at 1.0 is 2^{math.log2(2 * half):.0f}; "
                    f"{label} is {'above' if kept else 'not above'} half of it "
                    f"(2^{math.log2(half):.0f}), so the update is "
                    f"{'kept' if kept else 'rounded away'}"
                ),
                device=str(device),
            ))
    return out


def _sequential_sum(values: torch.Tensor) -> tuple[float, int | None]:
    """Add one value at a time with an accumulator of the values' dtype.

    Returns the sum and the 1-based addition at which it first became inf (None if never).
    """
    acc = torch.zeros((), dtype=values.dtype, device=values.device)
    partials = torch.empty_like(values)
    for i in range(values.numel()):
        acc = acc + values[i]
        partials[i] = acc
    inf_at = torch.nonzero(torch.isinf(partials))
    first_inf = int(inf_at[0].item()) + 1 if inf_at.numel() else None
    return acc.item(), first_inf


def accumulation(device: torch.device, n: int = 4096) -> list[DemoResult]:
    """Sums with a low-precision accumulator overflow or stall; torch.sum may not show it."""
    out = []
    fp16_max = torch.finfo(torch.float16).max
    for value, label in ((16.0, "16"), (0.01, "0.01")):
        exact = n * value
        for name in ("fp16", "fp32"):
            dtype = FLOATS[name]
            values = torch.full((n,), value, dtype=dtype, device=device)
            seq, first_inf = _sequential_sum(values)
            if math.isinf(seq):
                verdict = "inf"
                why = (f"the {name} running sum passes {name} max {fp16_max:g} at addition "
                       f"{first_inf} of {n}")
            elif abs(seq - exact) > 1e-3 * exact:
                verdict = "stalled"
                step = float(torch.finfo(dtype).eps) * 2.0 ** math.floor(math.log2(seq))
                why = (f"at {seq:g} the {name} spacing is {step:g}, so adding {label} rounds "
                       "back to the same value")
            else:
                verdict = "kept"
                why = f"the {name} accumulator holds every partial sum"
            out.append(DemoResult(
                name="accumulate",
                expression=f"sum of {n} x {label}, one addition at a time",
                dtype=name, result=seq, expected_exact=exact, verdict=verdict,
                explanation=why, device=str(device),
            ))
            reduced = values.sum().item()
            out.append(DemoResult(
                name="accumulate",
                expression=f"torch.sum of {n} x {label}",
                dtype=name, result=reduced, expected_exact=exact,
                verdict="inf" if math.isinf(reduced) else (
                    "kept" if abs(reduced - exact) <= 1e-3 * exact else "stalled"),
                explanation=(
                    f"torch.sum returns {name} but may accumulate in a wider type on "
                    f"{device.type}"
                    + (f"; the true sum is above fp16 max {fp16_max:g}, so it is inf whatever "
                       "the accumulator" if name == "fp16" and exact > fp16_max else "")
                ),
                device=str(device),
            ))
    return out


def tiny_value(device: torch.device, value: float = 1e-8) -> list[DemoResult]:
    out = []
    for name, dtype in FLOATS.items():
        stored = torch.tensor(value, dtype=dtype, device=device).item()
        smallest = float_format(name, dtype, "").min_subnormal
        out.append(DemoResult(
            name="tiny_value",
            expression=f"{value:g} stored",
            dtype=name, result=stored, expected_exact=value,
            verdict="zero" if stored == 0 else "nonzero",
            explanation=f"the smallest {name} above zero is {smallest:.3g}",
            device=str(device),
        ))
    return out


def _autocast_ops(a: torch.Tensor) -> dict[str, torch.Tensor]:
    m = torch.mm(a, a)
    target = torch.zeros(a.shape[0], dtype=torch.long, device=a.device)
    return {
        "torch.mm(a, a)": m,
        "softmax(mm output)": torch.softmax(m, dim=-1),
        "softmax(fp32 a)": torch.softmax(a, dim=-1),
        "layer_norm(fp32 a)": torch.nn.functional.layer_norm(a, a.shape[-1:]),
        "layer_norm(mm output)": torch.nn.functional.layer_norm(m, m.shape[-1:]),
        "cross_entropy(mm output)": torch.nn.functional.cross_entropy(m, target),
    }


def autocast_dtypes(device: torch.device) -> list[DemoResult]:
    """Which dtype ops return inside ``torch.autocast`` on this device, vs outside."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(16, 16, generator=gen, device=device)
    outside = {expr: str(t.dtype) for expr, t in _autocast_ops(a).items()}
    out = [
        DemoResult("autocast", f"{expr} outside autocast", "fp32", dt, "torch.float32",
                   "dtype", "no autocast: ops run in their inputs' dtype", str(device))
        for expr, dt in outside.items()
    ]
    for name in ("fp16", "bf16"):
        dtype = FLOATS[name]
        try:
            with torch.autocast(device.type, dtype=dtype):
                inside = {expr: str(t.dtype) for expr, t in _autocast_ops(a).items()}
        except RuntimeError as exc:
            out.append(DemoResult("autocast", f"autocast({device.type}, {name})", name,
                                  f"unsupported: {exc}", "n/a", "unsupported",
                                  "this torch build has no autocast for it here", str(device)))
            continue
        for expr, dt in inside.items():
            lowered = dt == str(dtype)
            out.append(DemoResult(
                "autocast", f"{expr} inside autocast({device.type}, {name})", name, dt,
                outside[expr], "dtype",
                (f"autocast runs it in {name}" if lowered else
                 f"kept in {dt.removeprefix('torch.')}: autocast does not lower it on "
                 f"{device.type} (precision-sensitive, or it follows its input)"),
                str(device),
            ))
    return out


def round_stochastic_bf16(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Round fp32 to bf16, up with probability equal to the dropped 16 bits' fraction.

    Adding uniform random bits below bf16's mantissa, then truncating, makes the
    rounding unbiased: E[round(x)] = x. (torchao's bf16 optimisers do the same.)
    """
    bits = x.contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, x.shape, dtype=torch.int32, device=x.device,
                          generator=generator)
    truncated = (bits + noise) & -65536  # 0xFFFF0000 as a signed int32 mask
    return truncated.view(torch.float32).to(torch.bfloat16)


def rounding_modes(device: torch.device, steps: int = 10_000, weights: int = 256,
                   update: float = 1e-4, seed: int = 0) -> list[DemoResult]:
    """Many tiny updates to a bf16 weight: round-to-nearest loses them, stochastic keeps them.

    ``weights`` independent copies of a weight of 1.0 get their own jittered updates; the
    mean over copies is reported so stochastic rounding's noise averages out.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    updates = update * (1 + 0.1 * torch.randn(steps, weights, generator=gen, device=device))
    exact = (1.0 + updates.double().sum(dim=0)).mean().item()
    nearest = torch.ones(weights, dtype=torch.bfloat16, device=device)
    stochastic = nearest.clone()
    master = torch.ones(weights, dtype=torch.float32, device=device)
    for i in range(steps):
        nearest = (nearest.float() + updates[i]).to(torch.bfloat16)
        stochastic = round_stochastic_bf16(stochastic.float() + updates[i], gen)
        master = master + updates[i]
    spacing = torch.finfo(torch.bfloat16).eps
    out = []
    for label, w, why in (
        ("bf16 round-to-nearest", nearest,
         f"each update (~{update:g}) is below half of bf16's spacing at 1.0 ({spacing:g}), "
         "so every add rounds back: the weight never moves"),
        ("bf16 stochastic rounding", stochastic,
         "rounds up with probability (dropped bits / spacing), so on average every update "
         f"counts; mean over {weights} weights"),
        ("fp32 master weight", master,
         "what mixed precision keeps: an fp32 copy whose spacing is far below the update"),
    ):
        value = w.float().mean().item()
        out.append(DemoResult(
            name="rounding",
            expression=f"1.0 + {steps} updates of ~{update:g} ({label})",
            dtype=label.split()[0], result=value, expected_exact=exact, verdict="drift",
            explanation=f"{why}; drift from the exact sum {value - exact:+.4g}",
            device=str(device),
        ))
    return out


def _block_readback(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, float]:
    """``x`` (one row of 32) through torchao's MXFP8 or NVFP4 quantiser and back, and the
    block scale its second element was stored with (NVFP4: times the tensor scale)."""
    if fmt == "mxfp8":
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import MXTensor
        from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

        q = MXTensor.to_mx(x, torch.float8_e4m3fn, 32, ScaleCalculationMode.RCEIL,
                           KernelPreference.EMULATED)
        return q.dequantize(torch.float32), float(q.scale.float().flatten()[0])
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale

    tensor_scale = per_tensor_amax_to_scale(x.abs().max())
    q = NVFP4Tensor.to_nvfp4(x, per_tensor_scale=tensor_scale)
    return (q.dequantize(torch.float32),
            float(q.scale.float().flatten()[0]) * float(tensor_scale))


# a value each format keeps in a block of its own size, and loses beside a 1000
_BLOCK_SMALL = {"mxfp8": 0.001, "nvfp4": 0.1}


def block_outlier(device: torch.device) -> list[DemoResult]:
    """A block shares one scale, set by its largest value: beside an outlier the small
    values of the same block fall below the block's smallest step and read back as 0."""
    from engine.numerics.formats import format_by_name

    out = []
    for fmt, small in _BLOCK_SMALL.items():
        info = format_by_name(fmt)
        element_min = info.min_subnormal / (2.0**-127 if fmt == "mxfp8" else 2.0**-9)
        for big in (1.0, 1000.0):
            x = torch.full((1, 32), small, device=device)
            x[0, 0] = big
            back, scale = _block_readback(x, fmt)
            value = float(back[0, 1])
            out.append(DemoResult(
                name="block_outlier",
                expression=f"{small:g} in a block whose largest value is {big:g}",
                dtype=fmt, result=value, expected_exact=small,
                verdict="underflow" if value == 0 else "kept",
                explanation=(f"{info.block_size}-element blocks share one scale ({scale:.3g} "
                             f"here, set by {big:g}); the smallest nonzero value in this "
                             f"block is {element_min * scale:.3g}"),
                device=str(device),
            ))
    return out


def run_demos(device: torch.device | str) -> list[DemoResult]:
    device = torch.device(device)
    return [
        *one_plus_small(device),
        *accumulation(device),
        *tiny_value(device),
        *autocast_dtypes(device),
        *rounding_modes(device),
        *block_outlier(device),
    ]
