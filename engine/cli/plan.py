"""``python3 main.py plan``: its arguments and its handler."""

from __future__ import annotations

import argparse
import dataclasses
import html
import json
import sys
from pathlib import Path

from engine.core.config import OPTIMIZERS, PRECISIONS, STRATEGIES
from engine.models.source import resolve_source


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="trace one training step on fake tensors: fits / does not "
                                    "fit per card, with no GPU and no weights",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="tiny",
                   help="preset name (see 'presets'), a local model folder, or a cached hub id")
    p.add_argument("--precision", default="fp32,bf16-amp",
                   help=f"comma-separated, from: {','.join(PRECISIONS)}")
    p.add_argument("--batch-size", type=int, default=1, help="micro-batch")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence")
    p.add_argument("--grad-checkpointing", action="store_true",
                   help="recompute each layer's forward in backward")
    p.add_argument("--grad-accum", type=int, default=1,
                   help="micro-batches per optimizer step (gradients accumulate across them)")
    p.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS, help="optimizer")
    p.add_argument("--strategy", default="none", choices=STRATEGIES,
                   help="ddp or fsdp2: plan one rank of --nproc-per-node (fake process group)")
    p.add_argument("--nproc-per-node", type=int, default=1,
                   help="world size the per-rank figure is for (with --strategy)")
    p.add_argument("--card", default="RTX 4090,H100 SXM",
                   help="comma-separated card names from resources/peak_flops.json")
    p.add_argument("--cuda-context", default="1GiB",
                   help="memory a card loses to the CUDA context and kernels (default 1GiB)")
    p.add_argument("--max-batch", type=int, default=64,
                   help="largest micro-batch to search for per card (0: no search)")
    p.add_argument("--measured", action="append", default=[], metavar="REPORT",
                   help="a JSON report or run journal of a real trial to show beside the "
                        "traced figures (repeatable); the run history is searched as well")
    p.add_argument("--no-history", action="store_true",
                   help="do not look for measured trials in this machine's run history")
    p.add_argument("--compile", action="store_true",
                   help="the card runs the step under torch.compile: the roofline counts a "
                        "fused step's traffic (float8 recipes always do)")
    p.add_argument("--trace-as", default="card", choices=("card", "cpu"),
                   help="autocast recipes: trace them under the cards' autocast op lists "
                        "(CUDA's, the default) or the CPU's, to compare with a CPU trial")
    p.add_argument("--full-trace", action="store_true",
                   help="trace the whole model; by default a model whose layers repeat is "
                        "traced cut to a few repeats and its figures scaled to its layer count")
    p.add_argument("--no-levers", action="store_true",
                   help="judge only the recipes asked: do not plan the changes (gradient "
                        "checkpointing, a low-bit optimizer, a quantised recipe, FSDP2) that "
                        "would make one fit")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--out", help="report file: .json or .html")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else None
    if out is not None and out.suffix.lower() not in (".json", ".html"):
        raise ValueError(f"--out '{args.out}' must end in .json or .html")
    if out is not None and out.is_dir():
        raise ValueError(f"--out '{args.out}' is a folder: name a file")
    resolve_source(args.model)  # a wrong path is refused before seconds of imports
    from engine.models.model_health import check_model
    from engine.run.fit import parse_bytes
    from engine.run.plan import PlanConfig, plan
    from engine.run.plan_text import format_plan

    cards = tuple(c.strip() for c in args.card.split(",") if c.strip())
    config = PlanConfig(model=args.model, precisions=args.precision,
                        batch_size=args.batch_size, seq_len=args.seq_len,
                        grad_checkpointing=args.grad_checkpointing, grad_accum=args.grad_accum,
                        optimizer=args.optimizer, strategy=args.strategy,
                        nproc_per_node=args.nproc_per_node,
                        cards=cards, context_bytes=parse_bytes(args.cuda_context),
                        max_batch=args.max_batch, measured=tuple(args.measured),
                        history=not args.no_history, levers=not args.no_levers,
                        compile=args.compile, trace_as=args.trace_as,
                        full_trace=args.full_trace)
    check_model(config.model, config.seq_len)  # bad input exits 2 before any tracing
    from engine.run.plan_bounds import check_plan_bounds

    check_plan_bounds(config)  # a trace this machine cannot finish is refused first

    def log(msg: str) -> None:
        if not args.quiet:
            print(f"plan: {msg}", file=sys.stderr, flush=True)

    result = plan(config, log)
    data = dataclasses.asdict(result)
    from engine.run.fp8_layers import payoff_lines, plan_payoff

    data["payoff"] = plan_payoff(result, cards)  # would fp8 pay, layer by layer (issue #49)
    if out is not None:
        text = (json.dumps(data, indent=2) if out.suffix.lower() == ".json"
                else plan_html(result) + "<h2>Would fp8 pay?</h2><pre>" + html.escape(
                    "\n".join(payoff_lines(data["payoff"])[1:])) + "</pre>")
        try:
            out.write_text(text, encoding="utf-8")
        except OSError as exc:
            print(f"ampscope: error: cannot write --out '{out}': {exc}", file=sys.stderr)
            return 1
    print(json.dumps(data, indent=2) if args.json
          else "\n".join([format_plan(result), *payoff_lines(data["payoff"])]))
    return 0


def plan_html(result) -> str:
    """The answer first: recipe x card, fits or not, with headroom."""
    from engine.measure.traffic import CONVENTION as TRAFFIC_CONVENTION
    from engine.report.charts import plan_timeline_html
    from engine.run.plan_text import duration_text, measured_over_predicted, size_text

    cards = [c.card for c in result.trials[0].cards] if result.trials else []
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cards)
    rows = []
    for t in result.trials:
        cells = []
        for c in t.cards:
            if c.fits is None:
                cells.append(f"<td>n/a: {html.escape(c.reason or '')}</td>")
            else:
                word = "fits" if c.fits else "does not fit"
                step = ("" if c.predicted_step_ms is None else
                        f"; step {duration_text(c.predicted_step_ms)} predicted "
                        f"({c.bound}-bound)")
                ratio = measured_over_predicted(t, c)
                step += "" if ratio is None else f", measured / predicted {ratio:.2f}"
                cells.append(f"<td>{word}, headroom {c.headroom_bytes / 2**30:.2f} GiB"
                             f"{step}</td>")
        peak = (f"{size_text(t.memory.total_bytes)} ({t.method})" if t.memory
                else f"n/a: {html.escape(t.reason or '')}")
        if t.autocast_policy:
            peak += f"<br>autocast traced: {html.escape(t.autocast_policy)}"
        if t.scaling:
            peak += f"<br>{html.escape(t.scaling)}"
        rows.append(f"<tr><th>{html.escape(t.precision)}</th><td>{peak}</td>"
                    f"<td>{_measured_cell(t)}</td>{''.join(cells)}</tr>")
    title = (f"Plan: {html.escape(result.model)}, batch {result.batch_size} x "
             f"{result.seq_len}")
    if result.grad_accum > 1:
        title += f", {result.grad_accum} micro-batches accumulated"
    if result.strategy != "none":
        title += f", {result.strategy.upper()} per rank of {result.nproc_per_node}"
    answers = "".join(f"<li>{html.escape(a.text)}</li>" for a in result.answers)
    answers = f"<ul class='answer'>{answers}</ul>" if answers else ""
    return (f"<!doctype html><meta charset='utf-8'><title>{title}</title><h1>{title}</h1>"
            f"{answers}<table border='1'><tr><th>recipe</th><th>traced peak</th>"
            "<th>measured peak</th>"
            f"{head}</tr>{''.join(rows)}</table>{_side_by_side_html(result)}"
            f"{plan_timeline_html(result)}"
            "<p>Usable memory is the card's memory as the driver reports "
            f"it minus a CUDA context allowance of {result.context_bytes / 2**30:.2f} GiB. "
            "Step times are roofline predictions, not measurements: the longer of the "
            "traced step's FLOPs by dtype at the datasheet peak and its bytes moved at the "
            f"datasheet memory bandwidth ({html.escape(TRAFFIC_CONVENTION)}).</p>")


def _measured_cell(trial) -> str:
    from engine.run.plan_text import size_text

    m = trial.measured
    if m is None:
        return "none in the run history"
    step = "" if m.step_ms is None else f", step {m.step_ms:.1f} ms (median)"
    return html.escape(f"{size_text(m.memory.total_bytes)} (run {m.run_id}, {m.device}{step})")


def _side_by_side_html(result) -> str:
    """Traced vs measured, category by category, for each recipe a real trial exists for."""
    from engine.run.plan_text import side_by_side

    parts = []
    for t in result.trials:
        if t.measured is None:
            continue
        rows = "".join(f"<tr><th>{html.escape(row)}</th><td>{traced}</td><td>{measured}</td>"
                       f"<td>{diff}</td></tr>" for row, traced, measured, diff in side_by_side(t))
        parts.append(f"<h2>{html.escape(t.precision)}: traced vs measured</h2>"
                     f"<p>Run {html.escape(t.measured.run_id)} on "
                     f"{html.escape(t.measured.device)}, from "
                     f"{html.escape(t.measured.source)}</p><table border='1'><tr><th></th>"
                     f"<th>traced</th><th>measured</th><th>traced vs measured</th></tr>{rows}"
                     "</table>")
    return "".join(parts)
