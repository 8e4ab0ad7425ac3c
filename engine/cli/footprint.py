"""``python main.py footprint``: each precision's load footprint, no training."""

from __future__ import annotations

import json
from collections.abc import Callable

from engine.cli.model_args import add_model_args
from engine.cli.output import say
from engine.core.config import RunConfig, parse_precisions
from engine.models.source import resolve_source


def add_parser(sub) -> None:
    p = sub.add_parser("footprint", help="load footprint of each precision (no training)")
    add_model_args(p, "fp32,fp16,bf16,int8,nf4")
    p.add_argument("--json", action="store_true", help="print JSON")


def footprint_rows(model: str, precisions: tuple[str, ...], device: str, seed: int = 0,
                   trust_remote_code: bool = False,
                   progress: Callable[[str], None] = lambda _: None) -> list[dict]:
    """Load footprint of each precision, as transformers' get_memory_footprint counts it."""
    from collections import Counter

    from engine.measure.inventory import count_params, dtype_map
    from engine.measure.memtrack import quant_state_parts, quant_state_tensors, unique_bytes
    from engine.models.load import load_model
    from engine.run.runner import preflight

    info = preflight(RunConfig(model=model, precisions=precisions, device=device, seq_len=1))
    rows = []
    for i, precision in enumerate(precisions, 1):
        progress(f"[{i}/{len(precisions)}] loading {model} as {precision}...")
        reason = info.unsupported_reason(precision)
        if reason:
            rows.append({"precision": precision, "status": "unsupported", "reason": reason,
                         "footprint_bytes": None, "params": None, "bytes_by_dtype": {}})
            continue
        try:
            loaded = load_model(model, precision, info.torch_device, seed, trust_remote_code,
                                train=False)
        except Exception as exc:  # a model folder that passed the checks and still fails
            from engine.models.model_health import one_line

            raise ValueError(f"{model} could not be loaded as {precision}: "
                             f"{one_line(exc)}") from None
        by_dtype: Counter = Counter()
        for p in dtype_map(loaded.model):
            if p.tied_to is None:
                by_dtype[p.dtype] += p.bytes
        rows.append({"precision": precision, "status": "ok", "reason": None,
                     "footprint_bytes": loaded.footprint_bytes,
                     "params": count_params(loaded.model)[0],
                     "bytes_by_dtype": dict(by_dtype), "note": loaded.footprint_note,
                     # absmax / quant map / SCB live beside the packed weights, outside
                     # the footprint
                     "quant_state_bytes": unique_bytes(quant_state_tensors(loaded.model)),
                     "quant_state_parts": list(dict.fromkeys(
                         name for name, _ in quant_state_parts(loaded.model)))})
        del loaded
    return rows


def run(args) -> int:
    precisions = parse_precisions(args.precision)
    RunConfig(model=args.model, precisions=precisions, device=args.device)  # checks, no torch
    resolve_source(args.model)  # a wrong path: one line, before seconds of imports
    say("loading torch and transformers...", err=True)
    rows = footprint_rows(args.model, precisions, args.device, args.seed,
                          args.trust_remote_code, lambda text: say(text, err=True))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'precision':<10} {'footprint':>14} {'parameters':>14}  bytes by dtype")
    for r in rows:
        if r["status"] != "ok":
            print(f"{r['precision']:<10} {'n/a':>14} {'n/a':>14}  {r['reason']}")
            continue
        dtypes = ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in r["bytes_by_dtype"].items())
        quant = r["quant_state_bytes"]
        beside = (f"; + quantisation state {quant / 2**20:.2f} MiB "
                  f"({', '.join(r['quant_state_parts'])})" if quant else "")
        print(f"{r['precision']:<10} {r['footprint_bytes'] / 2**20:>10.2f} MiB "
              f"{r['params']:>14,}  {dtypes}{beside}")
    notes = {r["note"] for r in rows if r.get("note")}
    for note in notes:
        print(f"note: {note}")
    return 0
