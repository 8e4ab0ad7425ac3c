"""Follow a run journal as it grows: the events of the lines added since the last poll.

The window's File > Watch run and ``main.py watch`` both poll a ``JournalFollower``.
Only complete lines (ending in a newline) are decoded: a line the writer is still
writing waits for the next poll. Reading is by byte offset, so a poll costs what was
added, however long the run.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from engine.core.events import LogEvent, RunFinished, StepSample, TrialStarted
from engine.core.file_kind import refuse_special
from engine.record import nonfinite
from engine.record.journal import JOURNAL_VERSION, checked_event, writer_alive
from engine.record.validate import validate_lab

MAX_POLL_BYTES = 64 * 2**20  # one poll's read: a huge file is followed in pieces
HEADER_WAIT_S = 10.0  # a journal still without its header line this long after its last change


class JournalFollower:
    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise ValueError(f"{self.path} is a folder: pick a run journal (.jsonl) inside it")
        refuse_special(self.path, "a run journal (.jsonl)")
        if not self.path.is_file():
            raise ValueError(f"journal not found: {self.path}: check the path")
        self._offset = 0
        self._partial = b""
        self.idle = False  # the last poll read nothing
        self._header = False
        self._steps: dict[str, list[StepSample]] = {}
        self.finished = False
        self.line_number = 0
        self.writer_pid = None  # from the header: the process that writes the journal
        self.repaired: list[str] = []  # fields an older writer left NaN in, read as n/a

    def poll(self) -> list:
        """Events added since the last call; raises ``ValueError`` for a file that is not
        an AmpScope journal, or a damaged line."""
        try:
            with open(self.path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < self._offset:
                    raise ValueError(f"{self.path} was cut short while it was watched (now "
                                     f"{size:,} bytes, {self._offset:,} were read): it was "
                                     "replaced or truncated; watch it again")
                fh.seek(self._offset)
                data = fh.read(MAX_POLL_BYTES)
        except OSError as exc:
            raise ValueError(f"cannot read {self.path}: {exc.strerror}") from None
        self.idle = not data
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        if len(self._partial) > MAX_POLL_BYTES:
            raise ValueError(f"{self.path} line {self.line_number + 1} is longer than "
                             f"{MAX_POLL_BYTES // 2**20} MiB: this is not an AmpScope run "
                             "journal")
        events = []
        for raw in lines:
            self.line_number += 1
            if not raw.strip():
                continue
            try:
                line = json.loads(raw.decode("utf-8"))
                if not isinstance(line, dict):
                    raise ValueError("not an object")
            except (ValueError, UnicodeDecodeError, RecursionError):
                raise ValueError(f"{self.path} line {self.line_number} is damaged: this is "
                                 "not an AmpScope run journal, or it was edited") from None
            if not self._header:
                self._check_header(line)
                continue
            if line.get("e") == "numerics":
                try:
                    validate_lab(line.get("numerics"))
                except ValueError as exc:
                    raise ValueError(f"{self.path} line {self.line_number}: the numerics "
                                     f"lab's results are damaged ({exc})") from None
                continue
            known = set(self.repaired)
            event = checked_event(self.path, self.line_number, line, self._steps,
                                  self.repaired)
            self.repaired = list(dict.fromkeys(self.repaired))  # a field, not every line
            if not known and self.repaired:  # said once, as reading the whole journal does
                events.append(LogEvent("warning", nonfinite.repair_note(
                    str(self.path), self.repaired), None, time.time()))
            if isinstance(event, TrialStarted) and event.round == 0:
                self._steps[event.precision] = []
            elif isinstance(event, StepSample):
                self._steps.setdefault(event.precision, []).append(event)
            elif isinstance(event, RunFinished):
                self.finished = True
            events.append(event)
        return events

    def _check_header(self, line: dict) -> None:
        if line.get("e") != "journal":
            raise ValueError(f"{self.path} is not an AmpScope run journal (no journal header "
                             "line)")
        version = line.get("version")
        if not isinstance(version, int) or version > JOURNAL_VERSION:
            raise ValueError(f"journal version {version!r} of {self.path} is newer than this "
                             f"AmpScope reads ({JOURNAL_VERSION}): update AmpScope to open it")
        self._header = True
        self.writer_pid = line.get("pid")

    def abandoned(self) -> bool:
        """The run will never end: its last poll found nothing new, no end was written, and
        the process that wrote it is gone (the rule History uses for "interrupted"). A file
        without its header line names no process: a journal's writer writes the header as
        it creates the file, so one still without it HEADER_WAIT_S after its last change
        was left by a process that died first."""
        if not self._header:
            return self.idle and self.quiet_s() >= HEADER_WAIT_S
        return not self.finished and self.idle and not writer_alive(self.writer_pid)

    def quiet_s(self) -> float:
        """Seconds since the file last changed (0 when it cannot be read)."""
        try:
            return max(0.0, time.time() - self.path.stat().st_mtime)
        except OSError:
            return 0.0

    @property
    def has_header(self) -> bool:
        return self._header
