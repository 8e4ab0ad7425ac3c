"""AmpScope: with no arguments opens the window; subcommands run headless.

Installed with pip, the ``ampscope`` command does the same (ampscope/cli.py).
"""

from ampscope.cli import main, run

__all__ = ["main"]

if __name__ == "__main__":
    run()
