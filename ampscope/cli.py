"""The ``ampscope`` console script: the same as ``python main.py``."""

from __future__ import annotations

import multiprocessing
import sys


def main(argv: list[str]) -> int:
    """No arguments open the window; subcommands run headless."""
    if not argv:
        try:
            from gui.app import main as gui_main
        except ImportError as exc:  # a headless install: no PySide6 / pyqtgraph
            print(f"ampscope: error: the window needs {exc.name or 'PySide6'}, which is not "
                  "installed: pip install -r requirements.txt (or the checkout's '.[window]'); "
                  "the headless commands work without it: see 'ampscope --help'",
                  file=sys.stderr)
            return 2
        return gui_main()
    from engine.cli import main as cli_main

    return cli_main(argv)


def run() -> None:
    multiprocessing.freeze_support()  # trials run in child processes, also when bundled
    argv = sys.argv[1:]
    code = main(argv)
    if argv:  # a headless command has written all it writes: exit without the heap's walk
        from engine.core.collector import before_exit

        before_exit()
    sys.exit(code)
