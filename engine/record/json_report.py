"""A JSON report read back: the whole run record, after the guard on anything read in.

The writer is engine.report.json_io; the reader sits here, in the record stage, because
``engine.record.journal.read_run`` (``report``, File > Open) opens a JSON report as well
as a journal. The bare tokens ``NaN`` / ``Infinity`` the writer keeps for overflowed
losses read back as floats (docs/report-schema.md); anywhere else (an older AmpScope wrote
NVML's NaN for an idle GPM window) they read as n/a, and the record says which fields of
which file were repaired (``RunRecord.repaired``, a line in its log).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from engine.core.events import LogEvent
from engine.core.file_kind import open_to_read
from engine.record import nonfinite
from engine.record.run_record import RunRecord
from engine.record.validate import validate_report


def read_json(path: str | os.PathLike) -> RunRecord:
    """Read a report; every failure is a ValueError that names the file and the fix."""
    path = Path(path)
    with open_to_read(path, "report", "an AmpScope .json report") as fh:
        try:
            raw = fh.read()
        except OSError as exc:
            raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a text file: pick an AmpScope .json report") from None
    return parse_report(text, str(path))


def parse_report(text: str, source: str) -> RunRecord:
    """A report's JSON text as a record, after ``validate_report``; ``source`` names it."""
    constants = []  # NaN / Infinity met: only then is the whole report walked

    def constant(token: str) -> float:
        constants.append(token)
        return float(token)

    try:
        data = json.loads(text, parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{source} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}): "
            "the file may be cut short or not an AmpScope report"
        ) from None
    except RecursionError:
        raise ValueError(f"{source} is nested too deeply to be an AmpScope report") from None
    found: dict[str, float] = {}
    data, repaired = nonfinite.scrub(data, found=found) if constants else (data, [])
    try:
        validate_report(data)
        record = RunRecord.from_dict(data)
    except ValueError as exc:
        raise ValueError(f"{source}: {nonfinite.unrepairable(str(exc), found)}") from None
    except (TypeError, KeyError, AttributeError) as exc:
        raise ValueError(
            f"{source} looks like an AmpScope report but a field is damaged ({exc!r}): "
            "export it again"
        ) from None
    if repaired:
        record.repaired = nonfinite.repair_note(source, repaired)
        record.logs.append(LogEvent("warning", record.repaired, None, record.started_s))
    return record
