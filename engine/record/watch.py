"""``main.py watch``: a live terminal view of a run journal, for servers without a desktop.

One line per optimiser step (step, loss, loss scale, tokens/s, MFU, memory; for a user's
own loop also the lr its optimizer step used, the grad norm and where the step's time
went, as milliseconds and a stacked bar) and one per scalar a user's loop logged
(``Recorder.log``: eval loss...) as the journal grows; it
ends when the run ends (exit 0), when the process writing the journal is gone without
ending the run (exit 1), or on Ctrl-C (exit 0, one line).
Memory is the allocator's (GPU) when the step has it, else the monitor's latest reading
(the GPU's used memory from NVML, or the host's resident memory).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.core.events import (
    ErrorEvent,
    LogEvent,
    MonitorSample,
    RunFinished,
    RunStarted,
    ScalarLog,
    StepSample,
    TrialFinished,
    TrialStarted,
)
from engine.record.follow import JournalFollower

HEADER = (f"{'precision':<10} {'step':>6} {'loss':>10} {'scale':>10} {'tokens/s':>10} "
          f"{'MFU':>7} {'memory':>16}")


def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 2**20:,.1f} MiB"


def _memory(step: StepSample, monitor: MonitorSample | None) -> str:
    if step.allocated_bytes is not None:
        return f"alloc {_mib(step.allocated_bytes)}"
    if monitor is not None and monitor.gpu_mem_used_bytes is not None:
        return f"gpu {_mib(monitor.gpu_mem_used_bytes)}"
    if monitor is not None and monitor.host_rss_bytes is not None:
        return f"rss {_mib(monitor.host_rss_bytes)}"
    return "n/a"


BAR_WIDTH = 20  # characters of the stacked time bar
# (StepSample field, short name, bar character): the step's time split, bottom layer first
PHASES = (("data_ms", "data", "d"), ("forward_ms", "fwd", "f"), ("backward_ms", "bwd", "b"),
          ("optimizer_ms", "opt", "o"))


def _stacked_bar(parts: list[float]) -> str:
    """The shares of ``parts`` as BAR_WIDTH characters (largest remainders get the rest)."""
    total = sum(parts)
    if total <= 0:
        return "." * BAR_WIDTH
    exact = [BAR_WIDTH * p / total for p in parts]
    counts = [int(e) for e in exact]
    by_remainder = sorted(range(len(parts)), key=lambda i: exact[i] - counts[i], reverse=True)
    for i in by_remainder[:BAR_WIDTH - sum(counts)]:
        counts[i] += 1
    return "".join(char * n for (_, _, char), n in zip(PHASES, counts))


def user_loop_text(step: StepSample) -> str:
    """lr, grad norm and the time split of a user's step ("" for a profile trial's)."""
    parts = [getattr(step, field) for field, _, _ in PHASES]
    if step.learning_rate is None and None in parts:
        return ""
    lr = "n/a" if step.learning_rate is None else f"{step.learning_rate:.4g}"
    norm = "n/a" if step.grad_norm is None else f"{step.grad_norm:.4g}"
    text = f"  lr {lr}  grad norm {norm}"
    if None not in parts:
        split = " ".join(f"{name} {ms:.1f}" for (_, name, _), ms in zip(PHASES, parts))
        text += f"  ms: {split} [{_stacked_bar(parts)}]"
        if step.eval_ms:  # an evaluation inside the step: apart from the four above
            text += f" eval {step.eval_ms:.1f}"
        if step.save_ms:  # a checkpoint save the Trainer made inside the step
            text += f" save {step.save_ms:.1f}"
    return text


def step_line(step: StepSample, monitor: MonitorSample | None) -> str:
    loss = "n/a" if step.loss is None else f"{step.loss:.4f}"
    scale = "n/a" if step.loss_scale is None else f"{step.loss_scale:.4g}"
    tps = "n/a" if step.tokens_per_s is None else f"{step.tokens_per_s:,.0f}"
    mfu = "n/a" if step.mfu is None else f"{100 * step.mfu:.1f}%"
    notes = (" warm-up" if step.warmup else "") + (" SKIPPED" if step.skipped else "")
    return (f"{step.precision:<10} {step.step:>6} {loss:>10} {scale:>10} {tps:>10} {mfu:>7} "
            f"{_memory(step, monitor):>16}{user_loop_text(step)}{notes}")


def watch(path, say: Callable[[str], None], interval_s: float = 0.5) -> int:
    """Print the journal's steps as they arrive until the run ends; returns the exit code."""
    follower = JournalFollower(path)
    monitor: MonitorSample | None = None
    steps = 0
    while True:
        for event in follower.poll():
            if isinstance(event, RunStarted):
                cfg = event.config
                say(f"run {event.run_id}: {cfg.get('model', '?')} "
                    f"({cfg.get('source', 'profile')}), journal {follower.path}")
                say(HEADER)
            elif isinstance(event, TrialStarted) and event.round == 0:
                say(f"-- {event.precision} started")
            elif isinstance(event, MonitorSample):
                monitor = event
            elif isinstance(event, StepSample):
                steps += 1
                say(step_line(event, monitor))
            elif isinstance(event, ScalarLog):
                value = "n/a (not a finite number)" if event.value is None else f"{event.value:.6g}"
                say(f"{event.precision:<10} {event.step:>6} {event.name} = {value}")
            elif isinstance(event, LogEvent) and event.level in ("warning", "error"):
                say(f"{event.level}: {event.message}")
            elif isinstance(event, ErrorEvent):
                say(f"error: {event.message}")
            elif isinstance(event, TrialFinished):
                r = event.result
                say(f"-- {r.precision} {r.status}" + (f": {r.reason}" if r.reason else ""))
            elif isinstance(event, RunFinished):
                say(f"run ended: {event.status}, {steps} steps")
                return 0
        if follower.abandoned() and not follower.has_header:
            say(f"run interrupted: {follower.path} has no journal header line and has not "
                f"changed for {follower.quiet_s():.0f} s: the process that made it ended "
                "before writing it")
            return 1
        if follower.abandoned():
            say(f"run interrupted: the process that wrote it (pid {follower.writer_pid}) is "
                f"gone without ending it, {steps} steps")
            return 1
        time.sleep(interval_s)
