"""The parser of ``python main.py`` and ``main``, which runs the command asked.

Bad input prints one line to stderr that says what to do and exits 2, before any
file is written.
"""

from __future__ import annotations

import argparse
import signal

from engine.cli import (
    fit,
    footprint,
    numerics,
    peak,
    plan,
    presets,
    profile,
    report,
    trace,
    watch,
)
from engine.cli.output import EXIT_BAD_INPUT, say

# in the order --help lists them
COMMANDS = {"profile": profile, "footprint": footprint, "presets": presets,
            "numerics": numerics, "fit": fit, "report": report, "watch": watch, "plan": plan,
            "peak": peak, "trace": trace}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        command = " ".join(self.prog.split()[1:])
        help_cmd = f"python main.py {command} --help" if command else "python main.py --help"
        raise ValueError(f"{message} (see '{help_cmd}')")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="main.py", description="AmpScope: mixed-precision training profiler")
    parser.add_argument("--version", action="store_true",
                        help="list the versions in use against the tested ranges, and exit")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    for module in COMMANDS.values():
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from engine.core.quiet import quiet_libraries

    quiet_libraries()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.version:
            from engine.core.versions import report as versions

            say(versions())
            return 0
        _warn_versions()
        if args.command is None:
            parser.print_help()
            return 0
        return COMMANDS[args.command].run(args)
    except ValueError as exc:
        say(f"ampscope: error: {exc}", err=True)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        say("ampscope: stopped (Ctrl-C)", err=True)
        return 128 + signal.SIGINT


def _warn_versions() -> None:
    """One line on stderr when a library is outside the tested range; the command goes on."""
    from engine.core.versions import warning_line

    line = warning_line(window=False)
    if line:
        say(f"ampscope: {line}", err=True)
