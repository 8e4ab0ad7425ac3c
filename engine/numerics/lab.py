"""The numerics lab: every numerics probe for one model and precision, as one JSON dict.

The dict is what a report's ``numerics`` key holds; ``format_lab_text`` prints it for
``python main.py numerics``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from engine.core.config import RunConfig
from engine.core.recipes import recipe as get_recipe
from engine.measure.flops import blended_peak
from engine.measure.peaks import PeakLookup, peak_flops, table
from engine.models.load import dims, load_model, make_batch
from engine.models.model_health import preflight
from engine.numerics.advisor import advise
from engine.numerics.demos import run_demos
from engine.numerics.formats import format_table
from engine.numerics.gradients import activation_stats, gradient_stats
from engine.numerics.optrace import trace_ops


def _json_safe(value):
    """inf and NaN as strings, so the dict stays strict JSON (a demo's result may be inf)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _asdict(obj) -> dict:
    return _json_safe(dataclasses.asdict(obj))


def run_lab(model: str, precision: str, device: str = "auto", batch_size: int = 2,
            seq_len: int = 64, seed: int = 0, trials: list[dict] | None = None,
            loss_scale: float | None = None, trust_remote_code: bool = False,
            progress: Callable[[str], None] = lambda _: None) -> dict:
    """Run formats, demos, gradient and activation ranges, the op trace and the advice.

    ``loss_scale`` (default: the GradScaler's initial scale of a run) is the scale the fp16
    gradient figures are computed at. ``trials`` (TrialResult dicts from a profile run)
    let the advice cite measured speed and memory. Raises ``ValueError`` for bad input or
    a precision this device cannot run. ``progress`` hears each stage as it starts.
    """
    config = RunConfig(model=model, precisions=(precision,), batch_size=batch_size,
                       seq_len=seq_len, device=device, seed=seed,
                       trust_remote_code=trust_remote_code,
                       **({} if loss_scale is None else {"init_scale": loss_scale}))
    info = preflight(config)
    reason = info.unsupported_reason(precision)
    if reason:
        raise ValueError(f"{precision} cannot run on this device: {reason}")
    recipe = get_recipe(precision)
    dev = info.torch_device
    with info.device_context():  # cuda:N must be the current device, not GPU 0
        torch.manual_seed(seed)
        progress(f"loading {model} as {precision}")
        loaded = load_model(model, precision, dev, seed, trust_remote_code)
        batch = make_batch(loaded, batch_size, seq_len, seed, dev)
        net = loaded.model
        progress("gradient ranges (one backward pass)")
        grads = gradient_stats(net, batch, recipe, config.init_scale, dev)
        progress("activation ranges (one forward pass)")
        activations = activation_stats(net, batch, recipe, dev)
        progress("autocast op trace")
        trace = trace_ops(net, batch, recipe, dev)
        progress("numeric demonstrations")
        demos = [_asdict(d) for d in run_demos(dev)]
    device_name = info.name if info.kind == "cuda" else "cpu"

    def lookup(dtype_key: str) -> PeakLookup:
        if dtype_key not in table()["dtypes"]:
            return PeakLookup(None, None, f"the peak table has no column for {dtype_key}")
        return peak_flops(device_name, dtype_key, info.sm_count, info.mig)

    capabilities = {
        "kind": info.kind,
        "name": info.name,
        "compute_capability": list(info.compute_capability) if info.compute_capability
        else None,
        "bf16_supported": info.bf16_supported,
        "fp8_supported": info.fp8_supported,
        "total_memory_bytes": info.total_memory_bytes,
    }
    model_dims = dims(loaded.config)
    return {
        "model": model,
        "precision": precision,
        "batch_size": batch_size,
        "seq_len": seq_len,
        "seed": seed,
        "device": info.describe(),
        "capabilities": capabilities,
        "model_dims": model_dims,
        "formats": [_asdict(f) for f in format_table()],
        "demos": demos,
        "gradients": _asdict(grads),
        "activations": _asdict(activations),
        "op_trace": _asdict(trace),
        "mfu_dtype_mix": _asdict(blended_peak(trace.flops_by_peak_dtype, lookup)),
        "advice": _asdict(advise(capabilities, trials, grads, model_dims)),
    }


# --- text --------------------------------------------------------------------------


def _num(value, fmt: str = ".3g") -> str:
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    return format(value, fmt)


def _pct(value) -> str:
    return "n/a" if value is None else f"{100 * value:.3g}%"


def _pow2(value) -> str:
    if value is None:
        return "n/a"
    exp = math.log2(value)
    return f"2^{exp:.0f}" if exp.is_integer() else f"{value:g}"


def _formats_text(formats: list[dict]) -> list[str]:
    lines = ["Number formats",
             f"  {'format':<9} {'bits':>4} {'s/e/m':>7} {'max':>10} {'min normal':>11} "
             f"{'min >0':>10} {'eps':>10} {'digits':>6}"]
    for f in formats:
        sem = ("/".join(str(f[k]) for k in ("sign_bits", "exponent_bits", "mantissa_bits"))
               if f["sign_bits"] is not None else "table")
        lines.append(f"  {f['name']:<9} {f['bits']:>4} {sem:>7} {_num(f['max']):>10} "
                     f"{_num(f['min_normal']):>11} {_num(f['min_subnormal']):>10} "
                     f"{_num(f['eps']):>10} {_num(f['decimal_digits'], '.2f'):>6}")
    lines.extend(f"  {f['name']}: {f['note']}" for f in formats if f["kind"] != "float")
    return lines


def _demos_text(demos: list[dict]) -> list[str]:
    lines = ["Live demos (computed on this device)"]
    for d in demos:
        result = d["result"] if isinstance(d["result"], str) else f"{d['result']:.10g}"
        exact = (d["expected_exact"] if isinstance(d["expected_exact"], str)
                 else f"{d['expected_exact']:.10g}")
        lines.append(f"  {d['expression']:<58} {d['dtype']:<5} = {result:<16} "
                     f"(exact {exact}) {d['verdict']}")
    lines.extend(f"    {d['expression']} [{d['dtype']}]: {d['explanation']}"
                 for d in demos if d["verdict"] in ("stalled", "inf", "drift"))
    return lines


def _gradients_text(g: dict) -> list[str]:
    o = g["overall"]
    under = ", ".join(f"{k} {_pct(v)}" for k, v in g["underflow_scale1"].items())
    lines = [
        f"Gradients (one step, loss {_num(g['loss'], '.4g')}, backward at scale "
        f"{_pow2(g['backward_scale'])}, unscaled)",
        f"  {o['nonzero']:,} nonzero of {o['values']:,} values, max |g| {_num(o['max_abs'])}, "
        f"{o['nonfinite']} inf/NaN",
        f"  flushed to zero at scale 1: {under}",
        f"  fp16 at scale {_pow2(g['loss_scale'])}: {_pct(o['underflow_fp16_at_scale'])} flushed, "
        f"max |g| x scale = {_num(g['overflow_ratio_fp16'])} x fp16 max",
        f"  suggested fp16 loss scales: {g['suggestion_note']}",
        f"  {'group':<11} {'tensors':>7} {'nonzero':>10} {'max |g|':>9} "
        f"{'fp16 flush @1':>13} {'@' + _pow2(g['loss_scale']):>8}",
    ]
    lines.extend(
        f"  {s['name']:<11} {s['tensors']:>7} {s['nonzero']:>10,} {_num(s['max_abs']):>9} "
        f"{_pct(s['underflow_fp16_scale1']):>13} {_pct(s['underflow_fp16_at_scale']):>8}"
        for s in g["groups"]
    )
    return lines


def _activations_text(a: dict) -> list[str]:
    lines = ["Activations by module type (one forward)",
             f"  {'module':<24} {'dtypes':<28} {'max |a|':>9} {'fp16 flush':>10} "
             f"{'> fp16 max':>10}"]
    for s in a["modules"]:
        dtypes = ",".join(d.removeprefix("torch.") for d in s["dtypes"])
        lines.append(f"  {s['name']:<24} {dtypes:<28} {_num(s['max_abs']):>9} "
                     f"{_pct(s['underflow_fp16_scale1']):>10} {_pct(s['above_fp16_max']):>10}")
    return lines


def _trace_text(t: dict, mix: dict) -> list[str]:
    by_dtype = ", ".join(f"{k} {v:,}" for k, v in t["flops_by_peak_dtype"].items())
    lines = [f"Op trace (one forward + backward): {t['total_flops']:,} FLOPs counted ({by_dtype})"]
    for op in t["ops"]:
        if op["flops"] or op["precision_sensitive"]:
            ins = ",".join(d.removeprefix("torch.") for d in op["input_dtypes"])
            outs = ",".join(d.removeprefix("torch.") for d in op["output_dtypes"])
            lines.append(f"  {op['phase']:<8} {op['op']:<58} x{op['count']:<4} {ins:>18} -> "
                         f"{outs:<18} {_pct(op['flops_share']) if op['flops'] else '':>6}")
    lines.extend(f"  GEMM {f['op']} ({f['phase']}) M={f['m']} N={f['n']} K={f['k']} "
                 f"{f['dtype']}: {f['reason']}" for f in t["flagged_gemms"])
    if t["uncounted_ops"]:
        lines.append(f"  no FLOP formula for: {', '.join(t['uncounted_ops'])}")
    peak = mix["flops_per_s"]
    lines.append("  peak FLOP/s for this dtype mix: "
                 + (f"{peak / 1e12:.4g} TFLOP/s" if peak else f"n/a ({mix['reason']})"))
    return lines


def _advice_text(a: dict) -> list[str]:
    scale = f" (initial loss scale {_pow2(a['init_scale'])})" if a["init_scale"] else ""
    lines = [f"Advice: {a['recommended']}{scale}"]
    for r in a["reasons"]:
        lines.append(f"  - {r['text']}: {r['figure'] or 'n/a'} [{r['source']}]")
    for alt in a["also_try"]:
        r = alt["reason"]
        lines.append(f"  also try {alt['precision']}: {r['text']}: {r['figure'] or 'n/a'} "
                     f"[{r['source']}]")
    for w in a["warnings"]:
        lines.append(f"  warning: {w['text']}: {w['figure'] or 'n/a'} [{w['source']}]")
    return lines


def format_lab_text(result: dict) -> str:
    """The lab's dict as terminal text; values that were not measured read "n/a"."""
    header = (f"AmpScope numerics lab: {result['model']} at {result['precision']} on "
              f"{result['device']} (batch {result['batch_size']} x {result['seq_len']} tokens)")
    sections = [
        [header],
        _formats_text(result["formats"]),
        _demos_text(result["demos"]),
        _gradients_text(result["gradients"]),
        _activations_text(result["activations"]),
        _trace_text(result["op_trace"], result["mfu_dtype_mix"]),
        _advice_text(result["advice"]),
    ]
    return "\n\n".join("\n".join(s) for s in sections) + "\n"
