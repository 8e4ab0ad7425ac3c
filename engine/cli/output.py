"""What every command shares when it speaks: printing that survives a closed terminal,
and the exit codes."""

from __future__ import annotations

import sys

EXIT_FAILED = 1  # trials failed, or the report could not be written
EXIT_BAD_INPUT = 2  # nothing ran


def say(text: str, err: bool = False) -> None:
    """Print, surviving a terminal that is gone (SIGHUP): the report matters more."""
    stream = sys.stderr if err else sys.stdout
    try:
        print(text, file=stream, flush=True)
    except (OSError, ValueError):
        pass
