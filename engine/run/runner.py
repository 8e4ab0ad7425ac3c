"""A run: a list of trials, one per precision, each in its own child process by default.

A child process gives each trial clean memory numbers and turns an OOM or a native
crash into that trial's status; the run goes on with the next precision. Events from
the child come back over a queue and reach ``on_event`` from the calling thread
(monitor samples from the monitor thread); every event is also appended to the run's
journal (``engine.record.journal``) before anyone else sees it, so a run that ends in any way
can be reopened. ``cancel()`` and ``abort()`` may be called from any thread.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable

from engine.core.config import BF16_COMPUTE, BF16_EMULATED, RunConfig, recipe_name
from engine.core.events import (
    ErrorEvent,
    LogEvent,
    PhaseChanged,
    RunFinished,
    RunStarted,
    StepSample,
    TrialFinished,
    TrialResult,
    TrialStarted,
)
from engine.core.quiet import quiet_libraries
from engine.measure.contention import cpu_count, summarise
from engine.measure.device import DeviceInfo
from engine.measure.environment import collect
from engine.measure.monitor import Monitor
from engine.models.model_health import preflight
from engine.record.journal import JournalWriter, journal_path, summary_from_steps
from engine.record.run_record import RunRecord
from engine.run.child import (
    StderrFile,
    become_child,
    describe_exit,
    exit_child,
    oom_kill_count,
    sigint_blocked,
)
from engine.run.rounds import RoundBook, TrialRound, choose_rounds, schedule

TERMINATE_GRACE_S = 5.0  # then killed
DRAIN_S = 1.0  # events still in the pipe when a child has exited


def _child_main(config_dict: dict, precision: str, info: DeviceInfo, out, cancel,
                parent_pid: int, stderr_path: str, prior_steps: tuple = (),
                round_index: int = 0) -> None:
    become_child(parent_pid, stderr_path)
    quiet_libraries()
    try:
        from engine.run.trial import run_trial

        config = RunConfig.from_dict(config_dict)
        result = run_trial(config, precision, info, out.put, cancel.is_set, prior_steps,
                           round_index)
    except BaseException as exc:  # run_trial never raises; this is the last line of defence
        result = TrialResult(precision, "error", f"{type(exc).__name__}: {exc}")
    out.put(TrialFinished(result, time.time()))
    # the result must be in the pipe before anything else (a sticky CUDA error at
    # interpreter exit) can take the process down
    out.close()
    out.join_thread()
    exit_child(0)


def _lab_main(lab_args: dict, out, parent_pid: int, stderr_path: str) -> None:
    become_child(parent_pid, stderr_path)
    quiet_libraries()
    try:
        from engine.numerics.lab import run_lab

        out.put(("ok", run_lab(**lab_args)))
    except ValueError as exc:
        out.put(("bad-input", str(exc)))
    except BaseException as exc:
        out.put(("error", f"{type(exc).__name__}: {exc}"))
    out.close()
    out.join_thread()
    exit_child(0)


class Runner:
    def __init__(self, config: RunConfig, on_event: Callable[[object], None] | None = None,
                 journal: bool = True, load=None):
        self.config = config
        self._load = load  # the host-load source; None: the real one (engine.measure.contention)
        self.on_event = on_event
        self.record = RunRecord()
        self.journal: JournalWriter | None = None
        self._use_journal = journal
        # plain flags, not Events: cancel() runs in signal handlers, and a handler that takes
        # a lock the interrupted code holds (a second Ctrl-C inside Event.set) deadlocks.
        # The loops that wait on a trial read them at least every 0.1 s and pass them on.
        self._cancelled = False
        self._aborted = False
        self._grace_s: float | None = None  # None: wait for the step, however long it takes
        self._lock = threading.Lock()

    def cancel(self, grace_s: float | None = None) -> None:
        """Stop after the current step, however long it takes; with ``grace_s`` (SIGTERM),
        a child that has not stopped by then is ended. ``abort()`` ends it at once. Safe in
        a signal handler: it only sets flags."""
        if grace_s is not None:
            self._grace_s = grace_s if self._grace_s is None else min(self._grace_s, grace_s)
        self._cancelled = True

    def abort(self) -> None:
        """Stop now: the running trial's process is ended; what it sent so far is kept."""
        self._aborted = True
        self.cancel()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def _is_cancelled(self) -> bool:
        return self._cancelled

    @property
    def journal_path(self):
        return self.journal.path if self.journal is not None else None

    def _emit(self, event) -> None:
        with self._lock:
            if self.journal is not None:
                self.journal.write(event)
            self.record.apply(event)
            if self.on_event is not None:
                self.on_event(event)

    def _journal_failed(self, message: str) -> None:
        # called under the lock from JournalWriter.write: tell the listeners directly
        event = LogEvent("warning", f"{message}: the run goes on without a journal", None,
                         time.time())
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
        run_id = uuid.uuid4().hex[:12]
        if self._use_journal:
            self.journal = JournalWriter(journal_path(run_id), self._journal_failed)
        self._emit(RunStarted(run_id, self.config.to_dict(), collect(info), time.time()))
        if info.fallback_reason:  # e.g. a driver too old for this torch: say why not the GPU
            self._emit(LogEvent("warning", info.fallback_reason, None, time.time()))
        emulated = [p for p in self.config.precisions if recipe_name(p) in BF16_COMPUTE]
        if info.bf16_hardware is False and emulated:
            self._emit(LogEvent(
                "warning", f"bf16: {BF16_EMULATED}: this CPU has no bf16 matrix instructions, "
                f"so {' and '.join(emulated)} run bf16 in emulation, slower than fp32; their "
                "speeds say nothing about bf16 hardware", None, time.time()))
        monitor = Monitor.for_device(info, self._emit, self.config.monitor_hz, self._load)
        monitor.start()
        try:
            rounds, why = choose_rounds(self.config, info=info)
            self._emit(LogEvent("info", why, None, time.time()))
            plan, book = schedule(self.config, rounds), RoundBook()
            windows: dict[str, list[tuple[float, float]]] = {}  # precision -> its rounds' spans
            for index, item in enumerate(plan):
                precision = item.precision
                if precision in book.done:  # an earlier round of it failed or was stopped
                    continue
                if self.cancelled:
                    result = book.stopped(item)
                else:
                    began = time.time()
                    self._emit(TrialStarted(precision, index, len(plan), began,
                                            item.round, item.rounds))
                    # a child process starting and importing torch is loading too
                    self._emit(PhaseChanged(precision, "loading", time.time(), item.round))
                    if self.config.strategy != "none":  # torchrun starts the ranks
                        from engine.distributed.trial import run_distributed

                        result = run_distributed(item.config, precision, info, self._emit,
                                                 self._is_cancelled)
                    elif self.config.isolation == "inline":
                        result = self._inline(precision, info, item, book)
                    else:
                        result = self._in_child(precision, info, monitor, item, book)
                    windows.setdefault(precision, []).append((began, time.time()))
                    result = book.finish(item, result)
                    if result is not None:
                        result = self._with_host_load(result, windows[precision])
                    else:  # its next round waits for the other precisions
                        self._emit(PhaseChanged(precision, "between rounds", time.time(),
                                                item.round))
                if result is not None:  # the precision's last round: its combined result
                    self._emit(TrialFinished(result, time.time()))
        finally:
            monitor.stop()
        self._emit(RunFinished("cancelled" if self.cancelled else "ok", time.time()))
        if self.journal is not None:
            self.journal.close()
        return self.record

    def _with_host_load(self, result: TrialResult, spans: list[tuple[float, float]]
                        ) -> TrialResult:
        """The trial's result with the host's load while its rounds ran."""
        with self._lock:  # the monitor thread appends samples under the same lock
            samples = [m for m in self.record.monitor_samples
                       if any(a <= m.time_s <= b for a, b in spans)]
        load = summarise(samples, cpu_count())
        return result if load is None else dataclasses.replace(result, host_load=load)

    def add_numerics(self, numerics: dict) -> None:
        """Attach the numerics lab's result to the run, in the record and the journal."""
        self.record.numerics = numerics
        if self.journal is not None:
            self.journal.write_numerics(numerics)
            self.journal.close()

    def _inline(self, precision: str, info: DeviceInfo, item: TrialRound,
                book: RoundBook) -> TrialResult:
        from engine.run.trial import run_trial

        return run_trial(item.config, precision, info, self._emit, self._is_cancelled,
                         book.prior_steps(precision), item.round)

    def _in_child(self, precision: str, info: DeviceInfo, monitor: Monitor, item: TrialRound,
                  book: RoundBook) -> TrialResult:
        ctx = mp.get_context("spawn")
        out, cancel = ctx.Queue(), ctx.Event()
        if self.cancelled:
            cancel.set()
        stderr = StderrFile()
        child = ctx.Process(
            target=_child_main,
            args=(item.config.to_dict(), precision, info, out, cancel, os.getpid(), stderr.path,
                  book.prior_steps(precision), item.round),
            name=f"ampscope-trial-{precision}",
            daemon=True,
        )
        oom_kills = oom_kill_count()
        with sigint_blocked():
            child.start()
        monitor.watch_pid(child.pid)
        steps: list[StepSample] = list(book.prior_steps(precision))
        result = None
        try:
            result = self._follow(child, out, cancel, steps)
        finally:
            _end(child)
            tail = stderr.tail()
            stderr.remove()
        if result is not None:
            return result
        return self._lost_child(precision, child.exitcode, steps, tail, oom_kills)

    def _follow(self, child, out, cancel, steps: list[StepSample]) -> TrialResult | None:
        """Relay the child's events until its result; None when it ended without one."""
        cancel_deadline = None
        drain_until = None
        terminated = False
        while True:
            if self.cancelled:
                cancel.set()
                if cancel_deadline is None and self._grace_s is not None:
                    cancel_deadline = time.monotonic() + self._grace_s
            if self._aborted and not terminated:
                cancel_deadline = time.monotonic()  # end it now; what it sent is still read
            if cancel_deadline is not None and time.monotonic() >= cancel_deadline:
                if terminated:
                    child.kill()
                else:
                    child.terminate()
                    terminated = True
                cancel_deadline = time.monotonic() + TERMINATE_GRACE_S
            try:
                event = out.get(timeout=0.1)
            except (EOFError, OSError):  # the pipe broke with the child
                return None
            except queue.Empty:
                if not child.is_alive():
                    # the child may have exited with events still in the pipe
                    drain_until = drain_until or time.monotonic() + DRAIN_S
                    if time.monotonic() > drain_until:
                        return None
                continue
            if isinstance(event, TrialFinished):
                return event.result
            if isinstance(event, StepSample):
                steps.append(event)
            self._emit(event)

    def _lost_child(self, precision: str, exitcode: int | None, steps: list, tail: str,
                    oom_kills_before: int | None) -> TrialResult:
        how = describe_exit(exitcode)
        stderr_note = f"; its last output: {tail}" if tail else ""
        if self.cancelled:
            status = "cancelled"
            reason = f"stopped by the user; the trial process was ended ({how})"
        elif exitcode == -9:
            after = oom_kill_count()
            if oom_kills_before is not None and after is not None and after > oom_kills_before:
                status = "oom"
                reason = ("the trial process was killed (SIGKILL) by the out-of-memory killer "
                          "(this cgroup's oom_kill count rose): try a smaller batch, sequence "
                          "or model, or raise the memory limit")
            else:
                status = "error"
                reason = ("the trial process was killed (SIGKILL): the system's out-of-memory "
                          "killer is one possibility (check 'dmesg' or the container's memory "
                          "limit), another process or user sending SIGKILL is another")
        else:
            status = "error"
            reason = (f"the trial process {how} before reporting (a native crash?): "
                      "the run went on with the next precision")
        tokens = self.config.tokens_per_step
        return TrialResult(precision, status, reason + stderr_note, steps=steps,
                           summary=summary_from_steps(steps, tokens))


def _end(child) -> None:
    """Make sure a child process is gone: terminate, then kill."""
    child.join(timeout=1.0)  # a child that reported exits at once
    if child.is_alive():
        child.terminate()
        child.join(timeout=TERMINATE_GRACE_S)
    if child.is_alive():
        child.kill()
        child.join()


def run_lab_in_child(lab_args: dict, stopped: Callable[[], bool]) -> dict | None:
    """The numerics lab in a child process; None when ``stopped()`` turned true first.

    Raises ``ValueError`` for bad input and ``RuntimeError`` when the lab failed.
    """
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    stderr = StderrFile()
    child = ctx.Process(target=_lab_main, args=(lab_args, out, os.getpid(), stderr.path),
                        name="ampscope-numerics", daemon=True)
    with sigint_blocked():
        child.start()
    answer = None
    drain_until = None
    try:
        while answer is None:
            if stopped():
                child.terminate()
                return None
            try:
                answer = out.get(timeout=0.1)
            except queue.Empty:
                if not child.is_alive():
                    drain_until = drain_until or time.monotonic() + DRAIN_S
                    if time.monotonic() > drain_until:
                        break
    finally:
        _end(child)
        tail = stderr.tail()
        stderr.remove()
    if answer is None:
        note = f"; its last output: {tail}" if tail else ""
        raise RuntimeError(f"the numerics lab process {describe_exit(child.exitcode)} "
                           f"before reporting{note}")
    kind, value = answer
    if kind == "bad-input":
        raise ValueError(value)
    if kind == "error":
        raise RuntimeError(value)
    return value
