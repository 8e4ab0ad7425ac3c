"""``python main.py fit``: the largest micro-batch per precision within a memory budget."""

from __future__ import annotations

import json
import sys

from engine.cli.model_args import add_model_args
from engine.core.config import DEFAULT_PRECISIONS, OPTIMIZERS, parse_precisions
from engine.models.source import resolve_source


def add_parser(sub) -> None:
    p = sub.add_parser("fit", help="largest micro-batch per precision within a memory budget")
    add_model_args(p, ",".join(DEFAULT_PRECISIONS))
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--memory-budget", help="e.g. 24GiB; on CUDA defaults to the GPU's "
                   "memory (a smaller one emulates a smaller card); required on the CPU")
    p.add_argument("--max-batch", type=int, default=1024, help="largest batch to try")
    p.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS)
    p.add_argument("--isolation", default="process", choices=("process", "inline"),
                   help="each probe in a child process (default) or in this one")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--quiet", action="store_true", help="no progress display")


def run(args) -> int:
    import dataclasses

    resolve_source(args.model)  # a wrong path is refused before seconds of imports
    from engine.run.fit import (
        FitCancelled,
        FitConfig,
        format_fit,
        format_probe,
        parse_bytes,
        run_fit,
    )

    budget = parse_bytes(args.memory_budget) if args.memory_budget is not None else None
    config = FitConfig(model=args.model, precisions=parse_precisions(args.precision),
                       seq_len=args.seq_len, memory_budget_bytes=budget, device=args.device,
                       max_batch=args.max_batch, optimizer=args.optimizer,
                       isolation=args.isolation, seed=args.seed,
                       trust_remote_code=args.trust_remote_code)

    def progress(precision, probe) -> None:
        if not args.quiet:
            print(format_probe(precision, probe), file=sys.stderr, flush=True)

    try:
        budget, results = run_fit(config, progress)
    except (KeyboardInterrupt, FitCancelled):
        print("ampscope: fit stopped by the user before it finished: no batch reported",
              file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps({"budget_bytes": budget,
                          "results": [dataclasses.asdict(r) for r in results]}, indent=2))
    else:
        print(format_fit(budget, results))
