"""Run history: every finished run kept in an SQLite database, as its JSON report.

The database lives in ``platformdirs.user_data_dir("AmpScope")``; the environment
variable ``AMPSCOPE_DATA_DIR`` moves it (tests use it to stay out of the user's data).
A few columns are copied out of the report so the list loads without parsing JSON.

Whatever is on disk, opening the store never fails: a damaged database (garbage,
truncated, a row of the wrong types) is moved aside with a timestamp and a fresh one
takes its place, with the readable runs copied over; a folder that cannot be written
gives a history that lives in memory for this session. ``notice`` says what happened,
once. Later failures (the file made read-only, locked by another program, deleted
while the window is open) raise ``HistoryError`` with a sentence that names the file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from engine.record.json_report import parse_report
from engine.record.run_record import RunRecord
from gui.history_status import record_outcome

DATA_DIR_ENV = "AMPSCOPE_DATA_DIR"
LOCK_WAIT_S = 0.5  # another program holding a lock: say so soon rather than freeze the window

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
_COLUMNS = ("id", "started", "model", "precisions", "device", "status", "report")
# rows whose listing columns have the types the list needs
_GOOD_ROW = ("typeof(id) = 'text' AND typeof(started) IN ('real', 'integer') "
             "AND typeof(model) = 'text' AND typeof(precisions) = 'text' "
             "AND typeof(device) = 'text' AND typeof(status) = 'text' "
             "AND typeof(report) = 'text' AND started BETWEEN 0 AND 1e11")


class HistoryError(Exception):
    """The history database cannot be used right now; the message names the file and why."""


def data_dir() -> Path:
    return Path(os.environ.get(DATA_DIR_ENV) or platformdirs.user_data_dir("AmpScope"))


def device_label(record: RunRecord) -> str:
    """The device a run used, as the engine described it; the requested one otherwise."""
    device = record.environment.get("device") or {}
    if not isinstance(device, dict):  # a report's environment is free-form
        return str(device)
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


def _damage(path: Path) -> str | None:
    """What is wrong with an existing database file; None when it can be used as it is."""
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            check = db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                return f"it is damaged ({check})"
            columns = [row[1] for row in db.execute("PRAGMA table_info(runs)")]
            if columns and tuple(columns) != _COLUMNS:
                return "its table of runs has unexpected columns"
            if columns:
                bad = db.execute(f"SELECT count(*) FROM runs WHERE NOT ({_GOOD_ROW})").fetchone()
                if bad[0]:
                    return f"{bad[0]} of its rows are damaged"
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            return None  # in use by another program, not damaged: never moved aside
        return f"it cannot be read ({exc})"
    except sqlite3.DatabaseError as exc:
        return f"it cannot be read ({exc})"
    return None


class HistoryStore:
    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else data_dir() / "history.sqlite3"
        self.notice: str | None = None  # what went wrong on opening, said once by the window
        self._memory: sqlite3.Connection | None = None  # when nothing can be written to disk
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            damage = _damage(self.path) if self.path.exists() else None
            if damage:
                self._start_fresh(damage)
            with self._connect(create=True) as db:
                db.execute(_SCHEMA)
        except (OSError, sqlite3.Error, HistoryError) as exc:
            self._memory = sqlite3.connect(":memory:")
            self._memory.execute(_SCHEMA)
            why = str(exc) if isinstance(exc, HistoryError) else (
                f"the history database {self.path} cannot be used ({exc}); check that its "
                "folder can be written")
            self.notice = (f"{why[0].upper()}{why[1:]}. Runs are kept for this session only: "
                           "export the ones to keep")

    def _start_fresh(self, damage: str) -> None:
        """Move a damaged file aside and build a new one with the rows that still read."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = self.path.with_name(f"{self.path.name}.damaged-{stamp}")
        self.path.replace(aside)
        rows = []
        try:
            with closing(sqlite3.connect(f"file:{aside}?mode=ro", uri=True)) as old:
                rows = old.execute(f"SELECT {', '.join(_COLUMNS)} FROM runs "
                                   f"WHERE {_GOOD_ROW}").fetchall()
        except sqlite3.DatabaseError:
            pass  # nothing readable: the fresh database starts empty
        with closing(sqlite3.connect(self.path)) as db, db:
            db.execute(_SCHEMA)
            db.executemany("INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        self.notice = (f"The history database {self.path} could not be used: {damage}. "
                       f"It was kept as {aside.name} and a fresh one started"
                       + (f" with the {len(rows)} runs that could be read." if rows else "."))

    @contextmanager
    def _connect(self, create: bool = False) -> Iterator[sqlite3.Connection]:
        if self._memory is not None:
            with self._memory:
                yield self._memory
            return
        # one short-lived connection per call, committed and closed at the end, so
        # nothing stays open when the window closes; a file deleted later is not quietly
        # made again (mode=rw), so the loss is said rather than hidden
        mode = "rwc" if create else "rw"
        try:
            with closing(sqlite3.connect(f"file:{self.path}?mode={mode}", uri=True,
                                         timeout=LOCK_WAIT_S)) as db, db:
                yield db
        except sqlite3.Error as exc:
            raise HistoryError(self._explain(exc)) from None

    def _explain(self, exc: sqlite3.Error) -> str:
        text = str(exc)
        if not self.path.exists() or "unable to open" in text or "no such table" in text:
            why = "it is missing (deleted while AmpScope was open?); restart AmpScope to " \
                  "start a new one"
        elif "readonly" in text:
            why = "it is read-only; make the file writable"
        elif "locked" in text or "busy" in text:
            why = "another program holds it locked; close that program or try again"
        else:
            why = text
        return f"the history database {self.path} cannot be used: {why}"

    def add(self, record: RunRecord) -> str:
        """Store (or replace) a run; returns its id. Raises ``HistoryError``."""
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
            record_outcome(record),  # "1 of 2 trials failed (oom)", not the runner's "ok"
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
                f"WHERE {_GOOD_ROW} ORDER BY started DESC"
            ).fetchall()
        return [
            HistoryEntry(r[0], r[1], r[2], tuple(p for p in r[3].split(",") if p), r[4], r[5])
            for r in rows
        ]

    def load(self, run_id: str) -> RunRecord:
        """The stored report, validated like an opened file; ``ValueError`` names what is
        wrong with it."""
        with self._connect() as db:
            row = db.execute("SELECT report FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise KeyError(f"no run '{run_id}' in the history")
        return parse_report(row[0], f"run {run_id} in the history ({self.path.name})")

    def delete(self, run_id: str) -> None:
        with self._connect() as db:
            db.execute("DELETE FROM runs WHERE id = ?", (run_id,))


def combine_trials(picks: list[tuple[RunRecord, str]]) -> RunRecord:
    """Trials picked from several runs as one record, each labelled ``run-id/precision``.

    The one ticked fp32 trial is the baseline of the ``vs fp32`` columns (named in the
    config); with none, or several, they stay n/a rather than pick one.
    """
    trials = []
    for record, precision in picks:
        trial = record.trial(precision)
        if trial is None:
            raise KeyError(f"run '{record.run_id}' has no {precision} trial")
        trials.append(dataclasses.replace(trial, precision=f"{record.run_id}/{precision}"))
    fp32 = [f"{record.run_id}/{p}" for record, p in picks if p == "fp32"]
    models = dict.fromkeys(str(record.config.get("model", "?")) for record, _ in picks)
    if len(fp32) == 1:
        baseline = {"baseline": fp32[0]}
    else:
        baseline = {"baseline_reason": "several fp32 trials are ticked: tick one to compare "
                    "against it" if fp32 else "no fp32 trial is ticked: tick one to see "
                    "ratios against it"}
    return RunRecord(
        run_id="+".join(dict.fromkeys(record.run_id for record, _ in picks)),
        config={"model": ", ".join(models), **baseline},
        trials=trials,
        status="ok",
        started_s=min((r.started_s for r, _ in picks), default=0.0),
    )


def comparison_note(picks: list[tuple[RunRecord, str]]) -> str:
    """What a person should know before reading ratios across runs."""
    runs = dict.fromkeys(record.run_id for record, _ in picks)
    note = f"Trials from {len(runs)} run(s), labelled run-id/precision."
    fp32 = [f"{record.run_id}/fp32" for record, p in picks if p == "fp32"]
    if len(fp32) == 1:  # otherwise the comparison's own baseline note says why not
        note += f" Baseline: {fp32[0]}."
    models = dict.fromkeys(str(record.config.get("model", "?")) for record, _ in picks)
    if len(models) > 1:
        note += (f" Warning: these trials trained different models ({', '.join(models)}): "
                 "their speed and memory are not comparable as ratios.")
    data = dict.fromkeys(record.data.source if record.data else "not recorded (older run)"
                         for record, _ in picks)
    if len(data) > 1:  # random tokens' loss cannot fall; a text's can: losses do not compare
        note += (f" Warning: these trials trained on different data ({', '.join(data)}): "
                 "their losses are not comparable.")
    settings = {_shape(record) for record, _ in picks}
    if len(models) == 1 and len(settings) > 1:
        note += " Warning: their batch size or sequence length differ."
    return note


def _shape(record: RunRecord) -> tuple:
    config = record.config if isinstance(record.config, dict) else {}
    return (config.get("batch_size"), config.get("seq_len"), config.get("grad_accum", 1))
