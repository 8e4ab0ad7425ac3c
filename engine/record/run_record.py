"""A run as data: the record built from events, and the same record read from JSON.

The CLI, the window and the report writers all look at a ``RunRecord``. A live run
fills it event by event (``apply``); an exported report rebuilds it (``from_dict``),
so a report made on a headless server shows the same views as a run made here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.core.events import (
    ErrorEvent,
    LogEvent,
    MonitorSample,
    RunFinished,
    RunStarted,
    ScalarLog,
    StepSample,
    TrainingData,
    TrialFinished,
    TrialResult,
    TrialStarted,
    from_dict,
    to_dict,
)

SCHEMA_VERSION = 1


@dataclass
class RunRecord:
    run_id: str = ""
    config: dict = field(default_factory=dict)
    environment: dict = field(default_factory=dict)
    trials: list[TrialResult] = field(default_factory=list)
    monitor_samples: list[MonitorSample] = field(default_factory=list)
    live_steps: dict[str, list[StepSample]] = field(default_factory=dict)
    logs: list[LogEvent] = field(default_factory=list)
    scalars: list[ScalarLog] = field(default_factory=list)  # a user's loop's rec.log(...)
    numerics: dict | None = None
    status: str = "running"
    started_s: float = field(default_factory=time.time)
    finished_s: float | None = None
    # None: every poll, as the journal holds them; a report says how it thinned them
    monitor_sampling: str | None = None
    # not written: what a reader read as n/a in a damaged file, said once (nonfinite.py)
    repaired: str | None = None
    data: TrainingData | None = None  # what the trials trained on; None in older reports

    def apply(self, event) -> None:
        """Fold one engine event into the record."""
        if isinstance(event, RunStarted):
            self.run_id = event.run_id
            self.config = event.config
            self.environment = event.environment
            self.started_s = event.time_s
            self.data = event.data
        elif isinstance(event, TrialStarted):
            if event.round == 0:  # later rounds of interleaved precisions add to the first's
                self.live_steps[event.precision] = []
        elif isinstance(event, StepSample):
            self.live_steps.setdefault(event.precision, []).append(event)
        elif isinstance(event, MonitorSample):
            self.monitor_samples.append(event)
        elif isinstance(event, TrialFinished):
            self.trials = [t for t in self.trials if t.precision != event.result.precision]
            self.trials.append(event.result)
            self.order_trials()
        elif isinstance(event, LogEvent):
            self.logs.append(event)
        elif isinstance(event, ScalarLog):
            self.scalars.append(event)
        elif isinstance(event, ErrorEvent):
            self.logs.append(LogEvent("error", event.message, event.precision, event.time_s))
            self.status = "error"
        elif isinstance(event, RunFinished):
            self.status = event.status
            self.finished_s = event.time_s

    def order_trials(self) -> None:
        """Trials in the configured order of precisions, however they finished (a stop
        ends interleaved precisions out of turn); others after them, as they came."""
        order = [str(p) for p in self.config.get("precisions", [])]
        self.trials.sort(key=lambda t: order.index(t.precision) if t.precision in order
                         else len(order))

    def trial(self, precision: str) -> TrialResult | None:
        return next((t for t in self.trials if t.precision == precision), None)

    def steps(self, precision: str) -> Sequence[StepSample]:
        """Steps of a precision: the finished trial's, or the live ones while it runs (a
        copy of a list; a read journal's columns as they are, read-only)."""
        done = self.trial(precision)
        steps = done.steps if done is not None and done.steps else self.live_steps.get(
            precision, [])
        return list(steps) if isinstance(steps, list) else steps

    def to_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "run_id": self.run_id,
            "status": self.status,
            "started_s": self.started_s,
            "finished_s": self.finished_s,
            "environment": self.environment,
            "config": self.config,
            "data": to_dict(self.data) if self.data is not None else None,
            "trials": [to_dict(t) for t in self.trials],
            # a sample's None fields are left out: the reader puts them back
            "monitor_samples": [{k: v for k, v in to_dict(m).items() if v is not None}
                                for m in self.monitor_samples],
            "monitor_sampling": self.monitor_sampling,
            "numerics": self.numerics,
            "logs": [to_dict(x) for x in self.logs],
            "scalars": [to_dict(x) for x in self.scalars],
        }

    @classmethod
    def from_dict(cls, data: dict) -> RunRecord:
        if not isinstance(data, dict) or "schema_version" not in data or "trials" not in data:
            raise ValueError(
                "this file is not an AmpScope report: export one with "
                "'python main.py profile ... --out report.json'"
            )
        version = data["schema_version"]
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise ValueError(
                f"report schema version {version!r} is newer than this AmpScope reads "
                f"({SCHEMA_VERSION}): update AmpScope to open it"
            )
        return cls(
            run_id=data.get("run_id", ""),
            config=data.get("config", {}),
            environment=data.get("environment", {}),
            trials=[from_dict(TrialResult, t) for t in data["trials"]],
            monitor_samples=[from_dict(MonitorSample, m) for m in data.get("monitor_samples", [])],
            logs=[from_dict(LogEvent, x) for x in data.get("logs", [])],
            scalars=[from_dict(ScalarLog, x) for x in data.get("scalars", [])],
            numerics=data.get("numerics"),
            status=data.get("status", "ok"),
            started_s=data.get("started_s", 0.0),
            finished_s=data.get("finished_s"),
            monitor_sampling=data.get("monitor_sampling"),
            data=from_dict(TrainingData, data["data"]) if data.get("data") else None,
        )
