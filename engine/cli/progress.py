"""``profile``'s progress on stderr, one line per step or event."""

from __future__ import annotations

import sys

from engine.cli.output import say
from engine.core.config import RunConfig, warmup_steps


class Progress:
    """Progress on stderr: one rewritten line on a terminal, a line a step in a log."""

    # the phases no step line shows: loading is the trial's first line, steps say warm-up
    SAID = {"memory step": "one untimed step tracking memory...",
            "profiled step": "one extra step under torch.profiler (not measured)...",
            "between rounds": "round done; its next round waits for the other precisions"}

    def __init__(self, config: RunConfig, enabled: bool):
        self.config = config
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.total = warmup_steps(config.warmup) + config.steps
        self.index = 0

    def __call__(self, event) -> None:
        from engine.core.events import (
            LogEvent,
            PhaseChanged,
            StepSample,
            TrialFinished,
            TrialStarted,
        )

        if not self.enabled:
            return
        if isinstance(event, PhaseChanged) and event.phase in self.SAID:
            self._line(f"  {event.precision}: {self.SAID[event.phase]}", end=True)
        if isinstance(event, TrialStarted):
            self.index = event.index + 1
            part = f" round {event.round + 1}/{event.rounds}" if event.rounds > 1 else ""
            # every round warms up again
            self.total = event.rounds * warmup_steps(self.config.warmup) + self.config.steps
            self._line(f"[{self.index}/{event.total}] {event.precision}{part}: loading", end=True)
        elif isinstance(event, StepSample):
            kind = "warm-up" if event.warmup else "step"
            scale = f"  scale {event.loss_scale:g}" if event.loss_scale is not None else ""
            skip = "  SKIPPED (inf/NaN)" if event.skipped else ""
            loss = f"{event.loss:.4f}" if event.loss is not None else "n/a"
            self._line(f"  {event.precision} {kind} {event.step + 1}/{self.total}  "
                       f"{event.step_ms:8.1f} ms  {event.tokens_per_s:10.0f} tok/s  "
                       f"loss {loss}{scale}{skip}")
        elif isinstance(event, TrialFinished):
            r = event.result
            why = f": {r.reason}" if r.reason else ""
            self._line(f"  {r.precision}: {r.status}{why}", end=True)
        elif isinstance(event, LogEvent) and event.level != "info":
            self._line(f"  {event.level}: {event.message}", end=True)

    def _line(self, text: str, end: bool = False) -> None:
        try:  # a closed terminal (SIGHUP) must not stop the run
            if self.tty:
                sys.stderr.write("\r\033[K" + text + ("\n" if end else ""))
            else:
                sys.stderr.write(text + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            self.enabled = False

    def close(self) -> None:
        if self.enabled and self.tty:
            say("", err=True)
