"""Ctrl-C, SIGTERM and SIGHUP during ``profile``: the run stops, what it measured is kept."""

from __future__ import annotations

import contextlib
import os
import signal

SIGNAL_GRACE_S = 5.0  # after SIGTERM/SIGHUP, a trial has this long to stop on its own


class Signals:
    """Ctrl-C, SIGTERM and SIGHUP during a run: the first stops the run, keeping what was
    measured; a second one stops the running trial at once. The report is still written."""

    HANDLED = tuple(s for s in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, s))

    def __init__(self, runner, inline: bool):
        self.runner = runner
        self.inline = inline
        self.received: list[int] = []

    @contextlib.contextmanager
    def installed(self):
        numbers = [getattr(signal, name) for name in self.HANDLED]
        previous = {n: signal.signal(n, self._handle) for n in numbers}
        try:
            yield self
        finally:
            for n, handler in previous.items():
                signal.signal(n, handler)

    def _handle(self, signum, _frame) -> None:
        self.received.append(signum)
        first = len(self.received) == 1
        if first and signum == signal.SIGINT:
            note("stopping after this step (Ctrl-C again to stop at once)...")
            self.runner.cancel()
        elif first:
            note(f"{signal.Signals(signum).name}: stopping the run, keeping what was measured")
            self.runner.cancel(grace_s=SIGNAL_GRACE_S)
        else:
            note("stopping now; what was measured is kept")
            self.runner.abort()
            if self.inline and len(self.received) == 2:
                raise KeyboardInterrupt  # an inline trial cannot be ended from outside


def note(text: str) -> None:
    # os.write, not print: a signal handler may interrupt a print to the same stream
    try:
        os.write(2, f"\n{text}\n".encode())
    except OSError:
        pass
