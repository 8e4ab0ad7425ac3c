"""Follow a run journal as it grows: the events of the lines added since the last poll.

The window's File > Watch run and ``main.py watch`` both poll a ``JournalFollower``.
Only complete lines (ending in a newline) are decoded: a line the writer is still
writing waits for the next poll. Reading is by byte offset, so a poll costs what was
added, however long the run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from engine.events import RunFinished, StepSample, TrialStarted
from engine.journal import JOURNAL_VERSION, decode


class JournalFollower:
    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise ValueError(f"{self.path} is a folder: pick a run journal (.jsonl) inside it")
        if not self.path.is_file():
            raise ValueError(f"journal not found: {self.path}: check the path")
        self._offset = 0
        self._partial = b""
        self._header = False
        self._steps: dict[str, list[StepSample]] = {}
        self.finished = False
        self.line_number = 0

    def poll(self) -> list:
        """Events added since the last call; raises ``ValueError`` for a file that is not
        an AmpScope journal, or a damaged line."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except OSError as exc:
            raise ValueError(f"cannot read {self.path}: {exc.strerror}") from None
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        events = []
        for raw in lines:
            self.line_number += 1
            if not raw.strip():
                continue
            try:
                line = json.loads(raw.decode("utf-8"))
                if not isinstance(line, dict):
                    raise ValueError("not an object")
            except (ValueError, UnicodeDecodeError):
                raise ValueError(f"{self.path} line {self.line_number} is damaged: this is "
                                 "not an AmpScope run journal, or it was edited") from None
            if not self._header:
                self._check_header(line)
                continue
            if line.get("e") == "numerics":
                continue
            try:
                event = decode(line, self._steps)
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                raise ValueError(f"{self.path} line {self.line_number}: a journal event is "
                                 f"damaged ({exc})") from None
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
