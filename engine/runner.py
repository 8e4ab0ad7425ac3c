"""A run: a list of trials, one per precision, each in its own child process by default.

A child process gives each trial clean memory numbers and turns an OOM or a native
crash into that trial's status; the run goes on with the next precision. Events from
the child come back over a queue and reach ``on_event`` from the calling thread
(monitor samples from the monitor thread). ``cancel()`` may be called from any thread.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time
import uuid
from collections.abc import Callable

from engine.config import RunConfig
from engine.device import DeviceInfo, probe
from engine.environment import collect
from engine.events import (
    ErrorEvent,
    LogEvent,
    RunFinished,
    RunStarted,
    StepSample,
    TrialFinished,
    TrialResult,
    TrialStarted,
)
from engine.models import load_config, max_positions, resolve_source
from engine.monitor import Monitor
from engine.quiet import quiet_libraries
from engine.record import RunRecord
from engine.rounds import RoundBook, TrialRound, choose_rounds, schedule

CANCEL_GRACE_S = 30.0  # a child that ignores cancel this long is terminated


def preflight(config: RunConfig) -> DeviceInfo:
    """Check what can be checked before loading anything; raises ``ValueError``."""
    info = probe(config.device)
    source = resolve_source(config.model)
    model_config, _ = load_config(source, config.trust_remote_code)
    limit = max_positions(model_config)
    if limit is not None and config.seq_len > limit:
        raise ValueError(
            f"sequence length {config.seq_len} is longer than {config.model} allows "
            f"({limit} positions): set --seq-len {limit} or less"
        )
    return info


def _child_main(config_dict: dict, precision: str, info: DeviceInfo, out, cancel,
                prior_steps: tuple = (), round_index: int = 0) -> None:
    quiet_libraries()
    from engine.trial import run_trial

    config = RunConfig.from_dict(config_dict)
    result = run_trial(config, precision, info, out.put, cancel.is_set, prior_steps, round_index)
    out.put(TrialFinished(result, time.time()))


class Runner:
    def __init__(self, config: RunConfig, on_event: Callable[[object], None] | None = None):
        self.config = config
        self.on_event = on_event
        self.record = RunRecord()
        self._cancel = threading.Event()
        self._child_cancel = None
        self._lock = threading.Lock()

    def cancel(self) -> None:
        self._cancel.set()
        if self._child_cancel is not None:
            self._child_cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def _emit(self, event) -> None:
        with self._lock:
            self.record.apply(event)
            if self.on_event is not None:
                self.on_event(event)

    def run(self) -> RunRecord:
        """Run every trial; raises ``ValueError`` before starting if the input is bad."""
        try:
            info = preflight(self.config)
        except ValueError as exc:
            self._emit(ErrorEvent(str(exc), None, time.time()))
            raise
        quiet_libraries()
        self._emit(RunStarted(uuid.uuid4().hex[:12], self.config.to_dict(), collect(info),
                              time.time()))
        if info.fallback_reason:  # e.g. a driver too old for this torch: say why not the GPU
            self._emit(LogEvent("warning", info.fallback_reason, None, time.time()))
        monitor = Monitor.for_device(info, self._emit, self.config.monitor_hz)
        monitor.start()
        try:
            rounds, why = choose_rounds(self.config)
            self._emit(LogEvent("info", why, None, time.time()))
            plan, book = schedule(self.config, rounds), RoundBook()
            for index, item in enumerate(plan):
                precision = item.precision
                if precision in book.done:  # an earlier round of it failed or was stopped
                    continue
                if self.cancelled:
                    result = book.stopped(item)
                else:
                    self._emit(TrialStarted(precision, index, len(plan), time.time(),
                                            item.round, item.rounds))
                    if self.config.strategy != "none":  # torchrun starts the ranks
                        from engine.distributed.trial import run_distributed

                        result = run_distributed(item.config, precision, info, self._emit,
                                                 self._cancel.is_set)
                    elif self.config.isolation == "inline":
                        result = self._inline(precision, info, item, book)
                    else:
                        result = self._in_child(precision, info, monitor, item, book)
                    result = book.finish(item, result)
                if result is not None:  # the precision's last round: its combined result
                    self._emit(TrialFinished(result, time.time()))
        finally:
            monitor.stop()
        self._emit(RunFinished("cancelled" if self.cancelled else "ok", time.time()))
        return self.record

    def _inline(self, precision: str, info: DeviceInfo, item: TrialRound,
                book: RoundBook) -> TrialResult:
        from engine.trial import run_trial

        return run_trial(item.config, precision, info, self._emit, self._cancel.is_set,
                         book.prior_steps(precision), item.round)

    def _in_child(self, precision: str, info: DeviceInfo, monitor: Monitor, item: TrialRound,
                  book: RoundBook) -> TrialResult:
        ctx = mp.get_context("spawn")
        out, cancel = ctx.Queue(), ctx.Event()
        self._child_cancel = cancel
        if self.cancelled:
            cancel.set()
        child = ctx.Process(
            target=_child_main,
            args=(item.config.to_dict(), precision, info, out, cancel,
                  book.prior_steps(precision), item.round),
            name=f"ampscope-trial-{precision}",
            daemon=True,
        )
        child.start()
        monitor.watch_pid(child.pid)
        steps: list[StepSample] = list(book.prior_steps(precision))
        result = None
        cancel_deadline = None
        try:
            while result is None:
                if self.cancelled and cancel_deadline is None:
                    cancel.set()
                    cancel_deadline = time.monotonic() + CANCEL_GRACE_S
                try:
                    event = out.get(timeout=0.1)
                except queue.Empty:
                    if not child.is_alive():
                        break
                    if cancel_deadline is not None and time.monotonic() > cancel_deadline:
                        child.terminate()
                        break
                    continue
                if isinstance(event, TrialFinished):
                    result = event.result
                else:
                    if isinstance(event, StepSample):
                        steps.append(event)
                    self._emit(event)
        finally:
            child.join(timeout=CANCEL_GRACE_S)
            if child.is_alive():
                child.kill()
                child.join()
            self._child_cancel = None
        if result is not None:
            return result
        return self._lost_child(precision, child.exitcode, steps)

    def _lost_child(self, precision: str, exitcode: int | None, steps: list) -> TrialResult:
        if self.cancelled:
            status, reason = "cancelled", "stopped by the user; the trial process was ended"
        elif exitcode == -9:
            status = "oom"
            reason = ("the trial process was killed (SIGKILL), most likely by the system's "
                      "out-of-memory killer: try a smaller batch or model")
        else:
            status = "error"
            reason = (f"the trial process exited with code {exitcode} before reporting "
                      "(a native crash?): the run went on with the next precision")
        return TrialResult(precision, status, reason, steps=steps)
