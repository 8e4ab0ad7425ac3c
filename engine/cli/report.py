"""``python main.py report``: a run journal's (or JSON report's) trials, or the run written
as a JSON, CSV or HTML report."""

from __future__ import annotations

from engine.cli.output import EXIT_FAILED, say
from engine.cli.report_out import check_out, write_report, written


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="list a run's trials (why any failed), or write a "
                                      "report from a run journal (or a JSON report)")
    p.add_argument("source", help="a run journal (runs/<run id>.jsonl in the data folder) "
                                  "or a JSON report")
    p.add_argument("--out", help="report file: .json, .csv or .html; without it, each "
                                 "trial's status and reason is printed")
    p.add_argument("--traceback", action="store_true",
                   help="print the full traceback of each trial an exception ended "
                        "(also with --out)")


def run(args) -> int:
    """A journal's (or JSON report's) trials, or the run in any report format."""
    out = check_out(args.out) if args.out else None
    from engine.record.failure_text import trial_lines
    from engine.record.journal import read_run

    record = read_run(args.source)
    if record.repaired:
        say(f"ampscope: note: {record.repaired}", err=True)
    if out is None or args.traceback:
        say("\n".join(trial_lines(record, args.source, args.traceback)))
    if out is None:
        return 0
    if not write_report(record, out):
        return EXIT_FAILED
    say(f"report of run {record.run_id} ({record.status}) written to {written(out)}")
    return 0
