"""What the terminal says about a run's trials: one line each with the reason, and for a trial
an exception ended, the command that prints its traceback (``report FILE --traceback``), or
the traceback itself on request. The one line stays short; the traceback is one command away."""

from __future__ import annotations

import os
import shlex

from engine.record.run_record import RunRecord


def traceback_command(source: str | os.PathLike) -> str:
    return f"python main.py report {shlex.quote(str(source))} --traceback"


def trial_lines(record: RunRecord, source: str | os.PathLike,
                tracebacks: bool = False) -> list[str]:
    """The run, then each trial's status and reason; ``tracebacks``: each traceback after its
    trial's line, as Python printed it (copied whole into a bug report)."""
    lines = [f"run {record.run_id} ({record.status}): {len(record.trials)} "
             f"trial{'s' * (len(record.trials) != 1)}"]
    for trial in record.trials:
        line = f"  {trial.precision}: {trial.status}" + (f": {trial.reason}"
                                                        if trial.reason else "")
        if trial.traceback and not tracebacks:
            line += f" (traceback: {traceback_command(source)})"
        lines.append(line)
        if trial.traceback and tracebacks:
            lines.append(trial.traceback.rstrip("\n"))
    return lines


def failed_line(record: RunRecord, failed: int, source: str | os.PathLike | None) -> str:
    """The profile's last line: how many trials failed, and where their tracebacks are."""
    line = f"{failed} of {len(record.trials)} trials failed: see the reasons above"
    if source is not None and any(t.traceback for t in record.trials):
        line += f" (tracebacks: {traceback_command(source)})"
    return line
