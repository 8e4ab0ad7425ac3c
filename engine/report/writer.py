"""Pick the report writer by file extension, and check an output path before a run."""

from __future__ import annotations

import os
from pathlib import Path

from engine.record import RunRecord
from engine.report.csv_io import write_csv
from engine.report.html import write_html
from engine.report.json_io import write_json

WRITERS = {".json": write_json, ".csv": write_csv, ".html": write_html, ".htm": write_html}


def _writer(path: Path):
    suffix = path.suffix.lower()
    if suffix not in WRITERS:
        shown = suffix or "(none)"
        raise ValueError(f"unknown report extension '{shown}': use .json, .csv or .html")
    return WRITERS[suffix]


def write_report(record: RunRecord, path: str | os.PathLike) -> Path:
    path = Path(path)
    return _writer(path)(record, path)


def check_writable(path: str | os.PathLike) -> None:
    """Fail now, with the fix, if a report could not be written to ``path`` later."""
    path = Path(path)
    _writer(path)
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ValueError(f"{path} is a folder: give a file name such as {path / 'report.json'}")
    if not folder.is_dir():
        raise ValueError(f"folder {folder} does not exist: create it or choose another --out")
    # the atomic writers create a temporary file in the folder, so the folder must be writable
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"folder {folder} is not writable: choose another --out")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{path} exists and is read-only: choose another --out or remove it")
