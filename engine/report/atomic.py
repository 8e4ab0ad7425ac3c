"""Write a file all at once or not at all.

A report is written to a temporary file beside the target and moved over it with
``os.replace`` (atomic on one file system), so a crash or a serialiser error never
leaves half a report, and an older report of the same name survives a failed write.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TextIO


def atomic_write(path: str | os.PathLike, write: Callable[[TextIO], None], newline=None) -> Path:
    """Call ``write(file)`` on a temporary text file, then move it to ``path``."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline=newline) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        # mkstemp makes the file private (0600); a report is an ordinary document
        os.chmod(tmp, target.stat().st_mode & 0o777 if target.exists() else 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
