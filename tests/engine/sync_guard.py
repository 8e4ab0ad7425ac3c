"""The ``sync_guard`` fixture: a log of every host sync and of a loop's own step marks.

The host waits for the device at ``Tensor.item``, ``Tensor.tolist``, ``Tensor.cpu``,
``float(tensor)``, ``torch.cuda.synchronize`` and ``torch.cuda.Event.synchronize``. The
guard wraps each (calling through) and logs it in order with marks a test places on
the loop's own calls (``StepTimer.start`` / ``stop``, the emit of a step), so a test
can say which syncs ran inside a step and which step's values a read brought back. On
the CPU nothing waits, but the loops make the same calls: the log proves the code path
a GPU takes.

Use: ``sync_guard.mark_calls(StepTimer, "start", "start")`` and the same for ``stop``,
``sync_guard.mark("emit", sample)`` from the loop's sink, then ``sync_guard.steps()``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import pytest
import torch

# (owner, attribute) of each call that makes the host wait for the device
SYNC_CALLS = ((torch.Tensor, "item"), (torch.Tensor, "tolist"), (torch.Tensor, "cpu"),
              (torch.Tensor, "__float__"), (torch.cuda, "synchronize"),
              (torch.cuda.Event, "synchronize"))


@dataclass(frozen=True)
class Entry:
    kind: str  # "sync" or "mark"
    name: str  # the wrapped call (sync) or the mark's name
    value: object = None  # what a sync returned; a mark's payload


@dataclass
class Step:
    """One step of the loop: the syncs between its start and stop marks, and everything
    logged after its stop until the next step starts (the end of the log for the last)."""

    inside: list[Entry] = field(default_factory=list)
    after: list[Entry] = field(default_factory=list)

    def syncs_after(self) -> list[Entry]:
        return [e for e in self.after if e.kind == "sync"]

    def marks_after(self, name: str) -> list[Entry]:
        return [e for e in self.after if e.kind == "mark" and e.name == name]


class SyncGuard:
    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.log: list[Entry] = []
        self._monkeypatch = monkeypatch
        for owner, attr in SYNC_CALLS:
            self._wrap(owner, attr, self._logged_sync(attr))

    def _wrap(self, owner, attr: str, make) -> None:
        self._monkeypatch.setattr(owner, attr, make(getattr(owner, attr)))

    def _logged_sync(self, name: str):
        def make(original):
            @functools.wraps(original)
            def wrapper(*args, **kwargs):
                value = original(*args, **kwargs)
                self.log.append(Entry("sync", name, value))
                return value

            return wrapper

        return make

    def mark(self, name: str, value: object = None) -> None:
        self.log.append(Entry("mark", name, value))

    def mark_calls(self, owner, attr: str, name: str) -> None:
        """Log a mark at each call of ``owner.attr``: before it runs for a start, after it
        returned otherwise, so whatever the call itself does counts as inside the step."""
        first = name == "start"

        def make(original):
            @functools.wraps(original)
            def wrapper(*args, **kwargs):
                if first:
                    self.mark(name)
                value = original(*args, **kwargs)
                if not first:
                    self.mark(name)
                return value

            return wrapper

        self._wrap(owner, attr, make)

    def steps(self, start: str = "start", stop: str = "stop") -> list[Step]:
        """The log cut at the start and stop marks, one ``Step`` per start."""
        steps: list[Step] = []
        inside = False
        for entry in self.log:
            if entry.kind == "mark" and entry.name == start:
                assert not inside, "a step started inside another"
                steps.append(Step())
                inside = True
            elif entry.kind == "mark" and entry.name == stop:
                assert inside, "a step stopped that had not started"
                inside = False
            elif steps:
                (steps[-1].inside if inside else steps[-1].after).append(entry)
        assert not inside, "the last step never stopped"
        return steps


@pytest.fixture
def sync_guard(monkeypatch) -> SyncGuard:
    return SyncGuard(monkeypatch)
