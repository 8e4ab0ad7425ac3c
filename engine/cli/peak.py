"""``python3 main.py peak``: this machine's measured matmul peak beside the datasheet's."""

from __future__ import annotations

import argparse
import json
import time


def add_parser(sub) -> None:
    p = sub.add_parser("peak", help="the device's measured matmul peak per dtype beside its "
                                    "datasheet peak (measured once per machine, then cached)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--rerun", action="store_true", help="measure again instead of the cache")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--fp8-shapes", action="store_true",
                   help="time each distinct Linear shape of --model at --batch-size x "
                        "--seq-len in bf16 and float8 instead (cached per device; the plan's "
                        "fp8 payoff table shows a card's timings beside its predictions)")
    p.add_argument("--model", help="with --fp8-shapes: a preset, a folder or a hub id")
    p.add_argument("--batch-size", type=int, default=1, help="with --fp8-shapes")
    p.add_argument("--seq-len", type=int, default=512, help="with --fp8-shapes")


def _rows(info, measured) -> list[dict]:
    from engine.measure import matmul_peak
    from engine.measure.peaks import peak_flops

    rows = []
    for dtype in matmul_peak.DTYPES:
        sheet = peak_flops(info.name if info.kind == "cuda" else None, dtype,
                           sm_count=info.sm_count, mig=info.mig)
        mine = measured.lookup(dtype)
        rows.append({
            "dtype": dtype,
            "measured_tflops": measured.tflops.get(dtype),
            "measured_reason": mine.reason,
            "datasheet_tflops": sheet.flops_per_s / 1e12 if sheet.flops_per_s else None,
            "datasheet_source": sheet.source,
            "datasheet_reason": sheet.reason,
        })
    return rows


def _text(info, measured, cached: bool, rows: list[dict]) -> str:
    from engine.measure import matmul_peak

    def number(v) -> str:
        return "n/a" if v is None else f"{v:.4g}"

    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(measured.measured_at_s))
    how = "cached; --rerun measures again" if cached else "measured now"
    sizes = ", ".join(f"{d} {n}x{n}" for d, n in measured.sizes.items())
    lines = [f"Matmul peak of {info.describe()}: best square matmul per dtype ({sizes}), "
             f"torch {measured.torch_version}, {when} ({how})",
             f"cache: {matmul_peak.cache_path()}"]
    table = [("dtype", "measured TFLOP/s", "datasheet TFLOP/s", "measured / datasheet")]
    for r in rows:
        m, d = r["measured_tflops"], r["datasheet_tflops"]
        table.append((r["dtype"], number(m), number(d), f"{m / d:.0%}" if m and d else "n/a"))
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    lines += ["  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in
                        enumerate(zip(row, widths))) for row in table]
    notes: dict[str, list[str]] = {}  # reason -> the dtypes it is given for, said once
    for key in ("measured_reason", "datasheet_reason"):
        for r in rows:
            if r[key]:
                notes.setdefault(r[key], []).append(r["dtype"])
    lines += [f"  {', '.join(dtypes)}: {reason}" for reason, dtypes in notes.items()]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from engine.measure import matmul_peak
    from engine.measure.device import probe

    if args.fp8_shapes or args.model:
        from engine.cli.fp8_shapes import run as run_shapes

        return run_shapes(args)
    info = probe(args.device)
    cached = None if args.rerun else matmul_peak.cached(info)
    measured = cached or matmul_peak.for_device(info, rerun=True)
    rows = _rows(info, measured)
    if args.json:
        print(json.dumps({"device": info.name, "key": measured.key, "cached": cached is not None,
                          "measured_at_s": measured.measured_at_s, "sizes": measured.sizes,
                          "rows": rows}, indent=1))
    else:
        print(_text(info, measured, cached is not None, rows))
    return 0
