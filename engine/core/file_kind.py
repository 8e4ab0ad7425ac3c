"""What a path the user named is, before anything opens it.

Opening a FIFO with no writer blocks for ever, and a character device (``/dev/zero``)
reads without end: every reader of a user's file (report, journal, watch, trace) checks
the kind first, with ``os.stat``, which never blocks on either.
"""

from __future__ import annotations

import os
import stat

_KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def refuse_special(path: str | os.PathLike, pick: str) -> None:
    """Raise one ValueError if ``path`` exists and is neither a regular file nor a folder;
    ``pick`` says what to choose instead (e.g. "an AmpScope .json report")."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return  # missing or unreadable: the open that follows says which, in its words
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    raise ValueError(f"{path} is {kind}, not a regular file: pick {pick}")


def open_to_read(path: str | os.PathLike, noun: str, pick: str):
    """``path`` opened in binary for reading, or one ValueError that says what to do: ``noun``
    names it when missing ("journal"), ``pick`` what to choose instead ("a run journal
    (.jsonl)")."""
    refuse_special(path, pick)
    try:
        return open(path, "rb")  # noqa: SIM115 (the caller closes it)
    except FileNotFoundError:
        raise ValueError(f"{noun} not found: {path}: check the path") from None
    except IsADirectoryError:
        raise ValueError(f"{path} is a folder: pick {pick} inside it") from None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
