"""Write a file all at once or not at all.

A report is written to a temporary file beside the target and moved over it with
``os.replace`` (atomic on one file system), so a crash or a serialiser error never
leaves half a report, and an older report of the same name survives a failed write.
A symlink is written through to its target. A temporary file left by a writer that was
killed (its name carries the writer's pid) is removed by the next write to that folder.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

TMP_SUFFIX = ".ampscope-tmp"


def resolve_target(path: str | os.PathLike) -> Path:
    """The file a write to ``path`` lands in: a symlink's target, not the link."""
    return Path(os.path.realpath(path))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temps(folder: Path) -> list[Path]:
    """Delete temporary files of interrupted writes (their writer's pid is gone)."""
    removed = []
    try:
        candidates = list(folder.glob(f".*{TMP_SUFFIX}"))
    except OSError:
        return removed
    for tmp in candidates:
        parts = tmp.name[: -len(TMP_SUFFIX)].rsplit(".", 2)  # .<name>, <pid>, <random>
        pid_text = parts[1] if len(parts) == 3 else ""
        if pid_text.isdigit() and not _pid_alive(int(pid_text)):
            try:
                tmp.unlink()
                removed.append(tmp)
            except OSError:
                pass
    return removed


def make_temp(target: Path) -> tuple[int, str]:
    """A private temporary file beside ``target``: ``.<name>.<pid>.<random>.ampscope-tmp``."""
    return tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.{os.getpid()}.",
                            suffix=TMP_SUFFIX)


def atomic_write(path: str | os.PathLike, write: Callable[[TextIO], None], newline=None) -> Path:
    """Call ``write(file)`` on a temporary text file, then move it to ``path``."""
    target = resolve_target(path)
    remove_stale_temps(target.parent)
    fd, tmp = make_temp(target)
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
