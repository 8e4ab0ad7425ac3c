"""Run history: every finished run kept in an SQLite database, as its JSON report.

The database lives in ``platformdirs.user_data_dir("AmpScope")``; the environment
variable ``AMPSCOPE_DATA_DIR`` moves it (tests use it to stay out of the user's data).
A few columns are copied out of the report so the list loads without parsing JSON.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from engine.record import RunRecord

DATA_DIR_ENV = "AMPSCOPE_DATA_DIR"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    started REAL NOT NULL,
    model TEXT NOT NULL,
    precisions TEXT NOT NULL,
    device TEXT NOT NULL,
    status TEXT NOT NULL,
    report TEXT NOT NULL
)
"""


def data_dir() -> Path:
    return Path(os.environ.get(DATA_DIR_ENV) or platformdirs.user_data_dir("AmpScope"))


def device_label(record: RunRecord) -> str:
    """The device a run used, as the engine described it; the requested one otherwise."""
    device = record.environment.get("device") or {}
    return str(device.get("description") or device.get("name")
               or record.config.get("device", ""))


@dataclass(frozen=True)
class HistoryEntry:
    id: str
    started_s: float
    model: str
    precisions: tuple[str, ...]
    device: str
    status: str


class HistoryStore:
    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else data_dir() / "history.sqlite3"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute(_SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        # one short-lived connection per call, committed and closed at the end, so
        # nothing stays open when the window closes
        with closing(sqlite3.connect(self.path)) as db, db:
            yield db

    def add(self, record: RunRecord) -> str:
        """Store (or replace) a run; returns its id."""
        if not record.run_id:
            raise ValueError("a run without a run_id cannot be stored in the history")
        precisions = [t.precision for t in record.trials] or list(
            record.config.get("precisions", [])
        )
        row = (
            record.run_id,
            record.started_s,
            str(record.config.get("model", "")),
            ",".join(precisions),
            device_label(record),
            record.status,
            json.dumps(record.to_dict()),
        )
        with self._connect() as db:
            db.execute("INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?, ?, ?)", row)
        return record.run_id

    def list(self) -> list[HistoryEntry]:
        """All runs, newest first."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT id, started, model, precisions, device, status FROM runs "
                "ORDER BY started DESC"
            ).fetchall()
        return [
            HistoryEntry(r[0], r[1], r[2], tuple(p for p in r[3].split(",") if p), r[4], r[5])
            for r in rows
        ]

    def load(self, run_id: str) -> RunRecord:
        with self._connect() as db:
            row = db.execute("SELECT report FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise KeyError(f"no run '{run_id}' in the history")
        return RunRecord.from_dict(json.loads(row[0]))

    def delete(self, run_id: str) -> None:
        with self._connect() as db:
            db.execute("DELETE FROM runs WHERE id = ?", (run_id,))


def combine_trials(picks: list[tuple[RunRecord, str]]) -> RunRecord:
    """Trials picked from several runs as one record, each labelled ``run-id/precision``.

    No fp32 trial of its own means no baseline: the ``vs fp32`` columns stay n/a
    rather than mixing runs measured under different conditions into one ratio.
    """
    trials = []
    for record, precision in picks:
        trial = record.trial(precision)
        if trial is None:
            raise KeyError(f"run '{record.run_id}' has no {precision} trial")
        trials.append(dataclasses.replace(trial, precision=f"{record.run_id}/{precision}"))
    return RunRecord(
        run_id="+".join(dict.fromkeys(record.run_id for record, _ in picks)),
        trials=trials,
        status="ok",
        started_s=min((r.started_s for r, _ in picks), default=0.0),
    )
