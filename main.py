"""AmpScope: with no arguments opens the window; subcommands run headless."""

import multiprocessing
import sys


def main(argv: list[str]) -> int:
    if not argv:
        from gui.app import main as gui_main

        return gui_main()
    from engine.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    multiprocessing.freeze_support()  # trials run in child processes, also when bundled
    sys.exit(main(sys.argv[1:]))
