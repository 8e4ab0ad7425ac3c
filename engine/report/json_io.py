"""The JSON report: the whole run record, readable back into the same objects.

Losses that overflowed are written as the bare tokens ``NaN`` / ``Infinity``, as
Python's json module does: they are measurements (the run diverged), not missing
values, so they are kept rather than turned into null. See docs/report-schema.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from engine.core.atomic import atomic_write
from engine.record.run_record import RunRecord
from engine.record.validate import validate_report


def comparison_dict(record: RunRecord) -> dict:
    """The verdict, the comparison table and the speed verdict as written for readers of
    the JSON file.

    Derived from the trials (readers of the report recompute it and ignore this key)."""
    from engine.record import spread
    from engine.record.compare import NOISY_RULE, comparison_rows, speed_verdict
    from engine.record.verdict import verdict as recommend

    verdict = speed_verdict(record.trials)
    return {
        "verdict": dataclasses.asdict(recommend(record)),
        "rows": [dataclasses.asdict(r) for r in comparison_rows(record, verdict)],
        "speed_verdict": dataclasses.asdict(verdict),
        "spread_method": spread.METHOD,
        "noisy_rule": NOISY_RULE,
    }


def write_json(record: RunRecord, path: str | os.PathLike) -> Path:
    data = record.to_dict()
    data["comparison"] = comparison_dict(record)
    return atomic_write(path, lambda fh: json.dump(data, fh, indent=1))


def read_json(path: str | os.PathLike) -> RunRecord:
    """Read a report; every failure is a ValueError that names the file and the fix."""
    path = Path(path)
    try:
        if path.exists() and not path.is_dir() and not path.is_file():
            raise ValueError(f"{path} is not a regular file: pick an AmpScope .json report")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"report not found: {path}: check the path") from None
    except IsADirectoryError:
        raise ValueError(f"{path} is a folder: pick a report .json file inside it") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a text file: pick an AmpScope .json report") from None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    return parse_report(text, str(path))


def parse_report(text: str, source: str) -> RunRecord:
    """A report's JSON text as a record, after ``validate_report``; ``source`` names it."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{source} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}): "
            "the file may be cut short or not an AmpScope report"
        ) from None
    except RecursionError:
        raise ValueError(f"{source} is nested too deeply to be an AmpScope report") from None
    try:
        validate_report(data)
        return RunRecord.from_dict(data)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    except (TypeError, KeyError, AttributeError) as exc:
        raise ValueError(
            f"{source} looks like an AmpScope report but a field is damaged ({exc!r}): "
            "export it again"
        ) from None
