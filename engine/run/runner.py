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
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from engine.core.child import (
    StderrFile,
    become_child,
    describe_exit,
    exit_child,
    oom_kill_count,
    sigint_blocked,
)
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
from engine.measure.busy_notice import BusyNotice
from engine.measure.contention import cpu_count, summarise
from engine.measure.device import DeviceInfo
from engine.measure.environment import collect
from engine.measure.monitor import Monitor
from engine.models import initial_weights, training_data
from engine.models.model_health import preflight
from engine.record.journal import JournalWriter, journal_path, runs_dir, summary_from_steps
from engine.record.run_record import RunRecord
from engine.run.phase_clock import (
    BUILD,
    IMPORTS,
    SPAWN,
    TEARDOWN,
    WAITING,
    WEIGHTS_WAIT,
    PhaseClock,
    add_times,
)
from engine.run.rounds import RoundBook, TrialRound, choose_rounds, schedule
from engine.run.trial_process import (
    PREFETCH_AT,
    SERVER_LOST,
    START_TEXT,
    ChildReady,
    TrialProcess,
    TrialTask,
    server_death,
    start_method,
    start_server,
)

TERMINATE_GRACE_S = 5.0  # then killed
DRAIN_S = 1.0  # events still in the pipe when a child has exited


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
        self._next: TrialProcess | None = None  # the next trial's process, started early
        self._weights: Path | None = None  # the run's initial weights (initial_weights)
        self._more = False  # a trial follows the current one
        self._device_kind: str | None = None  # the probed device's kind, set by run()

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
        if self._in_processes:  # its imports overlap the device probe and the weights' draw
            start_server(self.config.device)
        try:
            info = preflight(self.config)
            data = training_data.describe(self.config)  # a bad file: before any trial
        except ValueError as exc:
            self._emit(ErrorEvent(str(exc), None, time.time()))
            raise
        self._device_kind = info.kind  # how trial processes start (trial_process.start_method)
        quiet_libraries()
        run_id = uuid.uuid4().hex[:12]
        if self._use_journal:
            self.journal = JournalWriter(journal_path(run_id), self._journal_failed)
        self._emit(RunStarted(run_id, self.config.to_dict(), collect(info), time.time(), data))
        if info.fallback_reason:  # e.g. a driver too old for this torch: say why not the GPU
            self._emit(LogEvent("warning", info.fallback_reason, None, time.time()))
        emulated = [p for p in self.config.precisions if recipe_name(p) in BF16_COMPUTE]
        if info.bf16_hardware is False and emulated:
            self._emit(LogEvent(
                "warning", f"bf16: {BF16_EMULATED}: this CPU has no bf16 matrix instructions, "
                f"so {' and '.join(emulated)} run bf16 in emulation, slower than fp32; their "
                "speeds say nothing about bf16 hardware", None, time.time()))
        busy = BusyNotice(cpu_count(), self._emit)  # says so within the first trial
        monitor = Monitor.for_device(info, lambda e: (self._emit(e), busy.observe(e)),
                                     self.config.monitor_hz, self._load)
        monitor.start()
        try:
            rounds, why = choose_rounds(self.config, info=info)
            self._emit(LogEvent("info", why, None, time.time()))
            plan, book = schedule(self.config, rounds), RoundBook()
            in_processes = self._in_processes and bool(plan)
            if in_processes and start_method(info.kind) == "spawn":  # it imports while the
                self._next = self._new_process()  # weights are drawn
            if _draws_pay(plan):
                self._draw_weights(run_id)
            if in_processes:
                if self._next is None:  # a fork waits for the server's imports: the draw
                    self._next = self._new_process()  # overlapped them
                self._emit(LogEvent("info", START_TEXT[self._next.start_method], None,
                                    time.time()))
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
                        self._more = any(later.precision not in book.done
                                         for later in plan[index + 1:])
                        result = self._in_child(precision, info, monitor, item, book)
                    if item.round and precision in book.latest:
                        result = _with_first_round(result, book.latest[precision])
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
            self._end_next()
            initial_weights.remove(self._weights)
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

    @property
    def _in_processes(self) -> bool:
        return self.config.isolation == "process" and self.config.strategy == "none"

    def _draw_weights(self, run_id: str) -> None:
        """The run's seeded fp32 initial weights, drawn once for every trial to load."""
        if self.config.strategy != "none" or not initial_weights.needed(self.config.model):
            return
        began = time.time()
        try:
            try:
                runs_dir().mkdir(parents=True, exist_ok=True)
                folder = Path(tempfile.mkdtemp(prefix=f"{run_id}.weights.", dir=runs_dir()))
            except OSError:  # no data folder: the system's temporary one
                folder = Path(tempfile.mkdtemp(prefix=f"ampscope-{run_id}.weights."))
            self._weights = folder
            from engine.run.rounds import model_params

            why = initial_weights.too_big(model_params(self.config), folder)
            if why is not None:
                initial_weights.remove(folder)
                self._weights = None
                self._emit(LogEvent("info", f"each trial draws its own initial weights: {why}",
                                    None, time.time()))
                return
            initial_weights.write(self.config.model, self.config.seed,
                                  self.config.trust_remote_code, folder)
        except Exception as exc:  # each trial draws its own, as before, and reports failures
            initial_weights.remove(self._weights)
            self._weights = None
            self._emit(LogEvent("warning", f"the initial weights could not be drawn once for "
                                f"the run ({type(exc).__name__}: {exc}): each trial draws its "
                                "own", None, time.time()))
            return
        self._emit(LogEvent("info", f"initial weights drawn once in fp32 (seed "
                            f"{self.config.seed}) in {time.time() - began:.1f} s; every trial "
                            "loads them and casts them to its dtype", None, time.time()))

    def _trial_config(self, item: TrialRound) -> RunConfig:
        changes = {}
        if self._weights is not None:
            changes["initial_weights"] = str(self._weights)
        if item.round:  # the SQNR forward and the profiled step ran in the first round
            changes.update(quant_error=False, profile_step=False)
        if item.round < item.rounds - 1:  # the last round's memory step and tail replace these
            changes["last_round"] = False
        return item.config.replace(**changes) if changes else item.config

    def _inline(self, precision: str, info: DeviceInfo, item: TrialRound,
                book: RoundBook) -> TrialResult:
        from engine.run.trial import run_trial

        clock = PhaseClock()
        clock.mark(BUILD, time.time())

        def emit(event) -> None:
            if isinstance(event, PhaseChanged):
                clock.event(event.phase, event.time_s)
            self._emit(event)

        result = run_trial(self._trial_config(item), precision, info, emit, self._is_cancelled,
                           book.prior_steps(precision), item.round, book.prior_flops(precision))
        clock.mark(TEARDOWN, time.time())
        return _with_times(result, clock, time.time())

    def _end_next(self) -> None:
        if self._next is not None:
            self._next.release()
            _end(self._next.process)
            self._next.stderr.remove()
            self._next = None

    def _new_process(self) -> TrialProcess:
        return TrialProcess(self.config.model, self.config.trust_remote_code, self._device_kind)

    def _take_process(self) -> TrialProcess:
        """The process for the trial about to run: the one started before when it is still
        alive, else a new one."""
        proc, self._next = self._next, None
        if proc is not None and proc.alive():
            return proc
        if proc is not None:  # it died waiting: a fresh one says why, if it fails too
            proc.release()
            _end(proc.process)
            proc.stderr.remove()
        return self._new_process()

    def _in_child(self, precision: str, info: DeviceInfo, monitor: Monitor, item: TrialRound,
                  book: RoundBook) -> TrialResult:
        proc = self._take_process()
        if self.cancelled:
            proc.cancel.set()
        clock = PhaseClock()
        clock.mark(SPAWN, proc.spawn_s)
        oom_kills = oom_kill_count()
        monitor.watch_pid(proc.pid)
        # the previous trial's process is gone: the device is this one's
        proc.hand(TrialTask(self._trial_config(item).to_dict(), precision, info,
                            book.prior_steps(precision), item.round,
                            book.prior_flops(precision)))
        steps: list[StepSample] = list(book.prior_steps(precision))
        result = None
        try:
            result = self._follow(proc, steps, clock)
        finally:
            proc.release()
            _end(proc.process)
            tail = proc.stderr.tail()
            proc.stderr.remove()
        end_s = time.time()
        if result is None:
            result = self._lost_child(precision, proc.process.exitcode, steps, tail, oom_kills)
        return _with_times(result, clock, end_s)

    def _prestart(self) -> None:
        """Start the next trial's process now (the current one is in its untimed tail)."""
        if self._next is None and self._more and not self.cancelled:
            self._next = self._new_process()
            self._next.early = True

    def _follow(self, proc: TrialProcess, steps: list[StepSample],
                clock: PhaseClock) -> TrialResult | None:
        """Relay the child's events until its result; None when it ended without one."""
        child, out, cancel = proc.process, proc.out, proc.cancel
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
            if isinstance(event, ChildReady):
                _ready(clock, event, proc)
                if event.cuda_initialized:
                    self._emit(LogEvent(
                        "warning", "the trial process started CUDA before it was handed its "
                        "trial: its memory figures may include another context", None,
                        time.time()))
                continue
            if isinstance(event, TrialFinished):
                clock.mark(TEARDOWN, event.time_s)
                self._prestart()  # a round with no untimed step: beside its teardown at least
                return event.result
            if isinstance(event, StepSample):
                steps.append(event)
            if isinstance(event, PhaseChanged):
                clock.event(event.phase, event.time_s)
                if event.phase in PREFETCH_AT:
                    self._prestart()
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
        elif exitcode == SERVER_LOST and (server := server_death()):
            status = "error"
            reason = (f"the trial server process was {server} during the trial, which ended "
                      "with it (the steps measured before are kept): the run went on with the "
                      "next precision")
        else:
            status = "error"
            reason = (f"the trial process {how} before reporting (a native crash?): "
                      "the run went on with the next precision")
        tokens = self.config.tokens_per_step
        return TrialResult(precision, status, reason + stderr_note, steps=steps,
                           summary=summary_from_steps(steps, tokens))


def _draws_pay(plan: list[TrialRound]) -> bool:
    """Whether drawing the weights once pays: several trials share the draw, or the only one
    would draw its own in half precision (4-5x slower on the CPU than fp32) or save it to
    quantise while loading; a lone fp32 trial draws its own at the same cost."""
    import torch

    from engine.core.recipes import recipe

    if len(plan) != 1:
        return True
    try:
        rec = recipe(plan[0].precision)
    except (KeyError, ValueError):
        return True
    return bool(rec.quant) or rec.weight_dtype != torch.float32


def _with_first_round(result: TrialResult, earlier: TrialResult) -> TrialResult:
    """A later round's result with what only the first round measured (the SQNR forward,
    the profiled step: once per recipe), and the rounds' phase times added up."""
    return dataclasses.replace(
        result, quant_error=earlier.quant_error, quant_error_reason=earlier.quant_error_reason,
        profiled_step=earlier.profiled_step, profiled_step_reason=earlier.profiled_step_reason,
        phase_times=add_times(earlier.phase_times, result.phase_times))


def _ready(clock: PhaseClock, ready: ChildReady, proc: TrialProcess) -> None:
    """The marks a trial process's start-up gives: its imports, its wait for the device
    (started beside the trial before) or for the run's initial weights (the first)."""
    clock.mark(IMPORTS, ready.entry_s)
    handed = proc.handed_s or ready.ready_s
    if proc.early:
        clock.mark(WAITING, ready.ready_s)
    elif handed > ready.ready_s:
        clock.mark(WEIGHTS_WAIT, ready.ready_s)
    clock.mark(BUILD, max(ready.ready_s, handed))


def _with_times(result: TrialResult, clock: PhaseClock, end_s: float) -> TrialResult:
    starts = {}
    for phase, began in clock.marks:
        starts.setdefault(phase, began)
    starts["end"] = end_s
    return dataclasses.replace(result, phase_times=clock.times(end_s), phase_starts=starts)


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
