"""``python main.py numerics``: formats, live numeric demos, gradient ranges and advice for
one precision."""

from __future__ import annotations

import json
from pathlib import Path

from engine.cli.model_args import add_model_args
from engine.cli.output import EXIT_FAILED, say
from engine.cli.report_out import check_out, write_report
from engine.core.config import RunConfig, parse_precisions
from engine.models.source import resolve_source


def add_parser(sub) -> None:
    p = sub.add_parser("numerics", help="formats, live numeric demos, gradient ranges, advice")
    add_model_args(p, "fp16-amp")
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--out", help="also write a report (.json or .html) with the numerics")
    p.epilog = f"--precision takes one precision here\n\n{p.epilog}"


def run(args) -> int:
    precisions = parse_precisions(args.precision)
    if len(precisions) != 1:
        raise ValueError(f"numerics takes one precision (got {len(precisions)}): "
                         "pass one to --precision")
    RunConfig(model=args.model, precisions=precisions, device=args.device,
              batch_size=args.batch_size, seq_len=args.seq_len)  # checks before torch loads
    resolve_source(args.model)
    out = None
    if args.out:
        if Path(args.out).suffix.lower() == ".csv":
            raise ValueError("numerics --out takes .json or .html: a CSV holds training steps, "
                             "and the numerics lab runs none (use profile --out x.csv)")
        out = check_out(args.out)
    say("loading torch and transformers...", err=True)
    from engine.measure.device import probe
    from engine.measure.environment import collect
    from engine.numerics.lab import format_lab_text, run_lab
    from engine.record.run_record import RunRecord

    result = run_lab(args.model, precisions[0], args.device, args.batch_size, args.seq_len,
                     args.seed, trust_remote_code=args.trust_remote_code,
                     progress=lambda stage: say(f"numerics: {stage}...", err=True))
    print(json.dumps(result, indent=2) if args.json else format_lab_text(result))
    if args.out:
        config = RunConfig(model=args.model, precisions=precisions, device=args.device,
                           batch_size=args.batch_size, seq_len=args.seq_len, seed=args.seed)
        record = RunRecord(config=config.to_dict(), environment=collect(probe(args.device)),
                           numerics=result, status="ok")
        if not write_report(record, out):
            return EXIT_FAILED
        print(f"report written to {out}")
    return 0
