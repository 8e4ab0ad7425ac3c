"""``python main.py watch``: a run journal followed live in the terminal."""

from __future__ import annotations

from engine.cli.output import say


def add_parser(sub) -> None:
    p = sub.add_parser("watch", help="follow a run journal live in the terminal (Ctrl-C ends)")
    p.add_argument("journal", help="a run journal (runs/<run id>.jsonl), local or mounted")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between reads")


def run(args) -> int:
    """A live view of a journal; Ctrl-C ends the view, never the run it watches."""
    from engine.record.watch import watch

    if not 0 < args.interval <= 3600:
        raise ValueError(f"--interval must be above 0 and at most 3600 seconds "
                         f"(got {args.interval})")
    try:
        return watch(args.journal, say, args.interval)
    except KeyboardInterrupt:
        say("ampscope: stopped watching (the run itself goes on)", err=True)
        return 0
