"""Pick the report writer by file extension, and check an output path before a run.

The writers are imported when one writes: the HTML writer brings matplotlib and the JSON
writer the fp8 payoff (torch, transformers), seconds a refused ``--out`` or a CSV report
should not wait for."""

from __future__ import annotations

import os
from pathlib import Path

from engine.core.atomic import make_temp, remove_stale_temps, resolve_target
from engine.record.run_record import RunRecord


def _json(record: RunRecord, path: Path) -> Path:
    from engine.report.json_io import write_json

    return write_json(record, path)


def _csv(record: RunRecord, path: Path) -> Path:
    from engine.report.csv_io import write_csv

    return write_csv(record, path)


def _html(record: RunRecord, path: Path) -> Path:
    from engine.report.html import write_html

    return write_html(record, path)


WRITERS = {".json": _json, ".csv": _csv, ".html": _html, ".htm": _html}


def _writer(path: Path):
    suffix = path.suffix.lower()
    if suffix not in WRITERS:
        shown = suffix or "(none)"
        raise ValueError(f"unknown report extension '{shown}': use .json, .csv or .html")
    return WRITERS[suffix]


def write_report(record: RunRecord, path: str | os.PathLike) -> Path:
    from engine.report.thin import for_report

    path = Path(path)
    return _writer(path)(for_report(record), path)


def check_writable(path: str | os.PathLike) -> Path:
    """Fail now, with the fix, if a report could not be written to ``path`` later.

    Returns the file the report will land in (a symlink's target). The folder is
    tried for real, with the temporary file the writer will use: permissions alone do
    not show a read-only mount, a full disk or ``/proc`` as root.
    """
    given = Path(path)
    if given.is_dir():
        raise ValueError(f"{given} is a folder: give a file name such as {given / 'report.json'}")
    _writer(given)
    target = resolve_target(given)
    _writer(target)
    if target.is_dir():
        raise ValueError(f"{given} leads to the folder {target}: give a file name")
    folder = target.parent
    if not folder.is_dir():
        raise ValueError(f"folder {folder} does not exist: create it or choose another --out")
    if target.exists() and not target.is_file():
        raise ValueError(f"{given} leads to {target}, which is not a regular file (a pipe or "
                         "a device): choose another --out")
    if target.exists() and not os.access(target, os.W_OK):
        raise ValueError(f"{target} exists and is read-only: choose another --out or remove it")
    remove_stale_temps(folder)
    try:
        fd, tmp = make_temp(target)
    except OSError as exc:
        raise ValueError(f"cannot write in folder {folder} ({exc.strerror}): "
                         "choose another --out") from None
    os.close(fd)
    Path(tmp).unlink(missing_ok=True)
    return target
