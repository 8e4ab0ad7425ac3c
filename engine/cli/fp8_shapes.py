"""``python3 main.py peak --fp8-shapes --model M``: the model's Linear shapes timed in bf16
and float8 on this device (engine.measure.fp8_shape_timing), measured once, then cached."""

from __future__ import annotations

import argparse
import json


def _check(args: argparse.Namespace) -> None:
    if not args.fp8_shapes:
        raise ValueError("--model is for 'peak --fp8-shapes': add --fp8-shapes to time the "
                         "model's Linear shapes, or drop --model for the matmul peak")
    if not args.model:
        raise ValueError("peak --fp8-shapes needs --model (a preset, a folder or a hub id) "
                         "whose Linear shapes to time")
    if args.batch_size < 1 or args.seq_len < 1:
        raise ValueError("--batch-size and --seq-len must be at least 1 (M = batch x seq)")


def _table(result: dict, counts: dict, labels: list[str]) -> list[str]:
    from engine.measure.fp8_shape_cache import speedup

    head = ["M x K x N", "layers", "bf16 ms"] + [f"{label} ms (speed-up)" for label in labels]
    rows = [head]
    for name, count in counts.items():
        shape = result["shapes"].get(name)
        if shape is None:
            continue
        cells = [name.replace("x", " x "), str(count), f"{shape['bf16']['median_ms']:.4g}"]
        cells += [f"{shape[label]['median_ms']:.4g} (x{speedup(shape, label):.2f})"
                  for label in labels]
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]


def run(args: argparse.Namespace) -> int:
    _check(args)
    from engine.measure import fp8_shape_cache as cache
    from engine.measure import fp8_shape_timing as timing
    from engine.measure.device import probe
    from engine.run.fp8_layers import linear_layers

    info = probe(args.device)
    layers = linear_layers(args.model, args.batch_size * args.seq_len)
    counts: dict[str, int] = {}
    for la in sorted(layers, key=lambda la: (la.m * la.k * la.n, la.k, la.n)):
        name = cache.shape_key(la.m, la.k, la.n)
        counts[name] = counts.get(name, 0) + 1
    result = timing.measure(info, layers, rerun=args.rerun)
    labels = [label for label in timing.LABELS if label not in result["reasons"]]
    if args.json:
        print(json.dumps({
            "device": result["device"], "kind": result["kind"], "key": result["key"],
            "cache": str(cache.cache_path()), "convention": result["convention"],
            "timer": result["timer"], "reasons": result["reasons"],
            "skipped": result["skipped"],
            "shapes": [{**result["shapes"][n], "layers": c, **{
                f"{label}_speedup": cache.speedup(result["shapes"][n], label)
                for label in labels}} for n, c in counts.items() if n in result["shapes"]]},
            indent=1))
        return 0
    lines = [f"fp8 shape timings of {args.model} at {args.batch_size} x {args.seq_len} on "
             f"{info.describe()} ({result['timer']}): {result['convention']}",
             f"cache: {cache.cache_path()} (--rerun measures again)"]
    lines += _table(result, counts, labels)
    lines += [f"  {name}: {why}" for name, why in result["skipped"].items()]
    lines += [f"  {label}: {why}" for label, why in result["reasons"].items()]
    if not layers:
        lines.append(f"  {args.model} has no Linear layer AmpScope's float8 recipes convert")
    if info.kind != "cuda":
        lines.append("  These are this CPU's timings (float8 emulated): no card's payoff row "
                     "uses them.")
    print("\n".join(lines))
    return 0
