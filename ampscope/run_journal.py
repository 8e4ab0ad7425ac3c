"""The Recorder's run as the journal holds it: its start, every event written as it comes
(monitor samples buffered until the run's first event), and its end: the trial's result
(memory by category, summary, notes) and the report.

The end never raises: each release (counter, hooks, clipping patch, monitor) is tried
whatever the others did, and the user's own exception is what goes on. A mixin of
``ampscope.recorder.Recorder``, whose constructor makes the state it reads.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import time

import torch

from ampscope import ranks, run_notes
from ampscope.counting_step import COUNT_STEP
from engine.core.events import (
    ErrorEvent,
    MemoryBreakdown,
    RunFinished,
    RunStarted,
    TrialFinished,
    TrialResult,
    TrialStarted,
    TrialSummary,
)
from engine.core.recipes import recipe as recipe_of
from engine.measure import inventory, peak_choice
from engine.measure.environment import collect
from engine.measure.memory_breakdown import watched_memory
from engine.measure.peaks import PeakLookup
from engine.record.bounded import MAX_TEXT, cut, traceback_text
from engine.record.journal import JournalWriter
from engine.record.run_record import RunRecord
from engine.record.summary import summarise


def _tensor_bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0



class RunJournal:
    """A Recorder's journal, its run's start and end (see the module's docstring)."""

    def _open_journal(self) -> JournalWriter:
        """The journal; when it cannot be written (an unwritable data folder, a full disk)
        the run goes on without it, and the user is told once."""
        return JournalWriter(self.journal_file, on_failure=lambda reason: self._warn_once(
            "journal", f"{reason}: the run goes on without a journal"))

    def _begin_run(self) -> None:
        if self._run_begun:
            return
        config = {"model": self.name, "precisions": [self.precision],
                  "device": str(self.device), "source": self.source,
                  "recipe": self.describe_recipe()}
        if self.optimizer is not None:  # a report's config.optimizer is text when present
            config["optimizer"] = type(self.optimizer).__name__
        if self.world_size > 1:
            config.update(rank=self.rank, world_size=self.world_size,
                          local_rank=int(os.environ.get("LOCAL_RANK", self.rank)),
                          host=socket.gethostname(), pid=os.getpid(),
                          strategy=ranks.strategy(self.model))
        first = [RunStarted(self.run_id, config, collect(self.device_info), self._started_s),
                 TrialStarted(self.precision, 0, 1, time.time())]
        # the run's start, then the monitor samples buffered before it, in one hold of the
        # lock: a sample the monitor thread emits meanwhile waits, never lands before them
        with self._lock:
            for event in [*first, *self._early]:
                self._journal.write(event)
                self.record.apply(event)
            self._early = []
            self._run_begun = True  # from here on events go to the journal, not the buffer

    def _emit(self, event) -> None:
        with self._lock:
            if not self._run_begun:  # monitor samples before the first step
                self._early.append(event)
                return
            self._journal.write(event)
            self.record.apply(event)

    @property
    def _peak(self) -> PeakLookup:
        """The datasheet peak MFU divides by, chosen as a profile trial's: a MIG slice's share
        of its GPU's, blended by the dtypes the counting step's FLOPs ran in (the recipe's
        dtype until that step is counted)."""
        counted = self._counted.by_peak_dtype if self._counted is not None else {}
        key = (self.precision, tuple(sorted(counted.items())))
        if self._peak_for is None or self._peak_for[0] != key:  # once, not at every step
            self._peak_for = (key, peak_choice.datasheet_peak(
                self.device_info, recipe_of(self.precision), counted))
        return self._peak_for[1]

    def finish(self, exc: BaseException | None = None) -> RunRecord:
        """End the run: the last steps, the trial's result, the report. Idempotent, and
        never raises: the user's own exception (``exc``) is what goes on."""
        if self._finished:
            return self.record
        self._finished = True
        atexit.unregister(self._at_exit)
        for release in (self._stop_counter, self._remove_hooks, self._unpatch_clip,
                         self._stop_monitor):
            self._guarded(release)  # each one, whatever the others did
        self._guarded(self._write_end, exc)
        if self.out is not None and self.rank != 0:
            print(f"ampscope: rank {self.rank} journaled to {self.journal_file}; rank 0 writes "
                  f"the report of all ranks to {self.out}", file=sys.stderr)
        elif self.out is not None:
            from engine.report.writer import write_report

            try:
                self.report_path = write_report(
                    self.record if self.world_size == 1 else ranks.all_ranks(self.journal_file),
                    self.out)
            except Exception as err:  # the out folder vanished, the disk filled up...
                reason = err.strerror if isinstance(err, OSError) and err.strerror else err
                self._warn_once("report", f"the report could not be written to {self.out} "
                                f"({reason}); the run is in its journal: python3 main.py "
                                f"report {self.journal_file} --out <report file>")
        return self.record

    def _guarded(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as err:
            self._warn_once("internal", f"ending the run failed in {fn.__name__}() "
                            f"({type(err).__name__}: {err}); the journal {self.journal_file} "
                            "keeps what was recorded")

    def _remove_hooks(self) -> None:
        self._autostart.remove()
        if self._autocast_probe is not None:
            self._autocast_probe.remove()
        if self._backward_end is not None:
            self._backward_end.remove()
        hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook.remove()

    def _stop_monitor(self) -> None:
        if self._monitor is not None:
            self._monitor.stop()

    def _write_end(self, exc: BaseException | None) -> None:
        if self._journal is None:  # finished without a start: the run still gets a journal
            self._journal = self._open_journal()
        if not self._pending and not self.steps:
            print(f"ampscope: run {self.run_id} recorded no step: call rec.step() once per "
                  "optimizer step; the journal and report hold what is known", file=sys.stderr)
        try:
            self.flush()
            if self._flops is None:  # the run ended before a step after the warm-up
                self._flops = self._flops_info(None, "no step after the warm-up step was "
                                               "recorded")
        finally:
            self._begin_run()
            self._emit_logged(None)
            status, reason, trace = "ok", None, None
            if exc is not None:
                if isinstance(exc, KeyboardInterrupt):
                    status, reason = "cancelled", "stopped by Ctrl-C in the user's script"
                else:  # any length the user's message has, the journal reads back
                    status, reason = "error", cut(f"{type(exc).__name__}: {exc}", MAX_TEXT - 40)
                    trace = traceback_text(exc)
                    self._emit(ErrorEvent(f"the user's training raised {reason}",
                                          self.precision, time.time()))
            elif not self.steps:  # nothing measured is not an ok run
                status, reason = "error", (
                    "no step was recorded: call rec.step() once per optimizer step"
                    + (f" ({self._failed_steps} rec.step() calls failed: see the warning)"
                       if self._failed_steps else ""))
            result = self._result(status, reason, trace)
            self._emit(TrialFinished(result, time.time()))
            self._emit(RunFinished("ok" if status == "ok" else status, time.time()))
            self._journal.close()

    def _result(self, status: str, reason: str | None,
                traceback: str | None = None) -> TrialResult:
        params, trainable = inventory.count_params(self.model)
        return TrialResult(
            precision=self.precision,
            status=status,
            reason=reason,
            recipe=self.describe_recipe(),
            device=self.device_info.describe(),
            param_count=params,
            trainable_params=trainable,
            memory=self._memory(),
            dtype_map=inventory.dtype_map(self.model),
            module_tree=inventory.module_tree(self.model),
            flops=self._flops,
            steps=list(self.steps),
            summary=self._summary(),
            started_s=self._started_s,
            finished_s=time.time(),
            source=self.source,
            notes=self._notes(),
            traceback=traceback,
        )

    def _notes(self) -> list[str]:
        return [*run_notes.notes(self._norm_methods, self.steps, self._lr_differed),
                *self.asked_notes]

    def _memory(self) -> MemoryBreakdown:
        params_bytes = inventory.unique_param_bytes(self.model) + sum(
            b.numel() * b.element_size() for b in self.model.buffers())
        # a gradient has its parameter's dtype and shape
        grads = sum(p.numel() * p.element_size() for p in self.model.parameters()
                    if p.requires_grad)
        opt = (sum(_tensor_bytes(s) for s in self.optimizer.state.values())
               if self.optimizer is not None else 0)
        known = params_bytes + grads + opt
        peak_alloc, peak_res, covers = self._alloc.stop()
        if self._measured is not None:
            return watched_memory(
                self._measured,
                f"engine.measure.memtrack over the user's step {COUNT_STEP} (untimed by the "
                "summary): every storage from allocation to release; the largest sum of live "
                "bytes", (peak_alloc, peak_res, covers),
                "categories are what was held at the peak of the watched step; the batch made "
                "by the loop's data loading counts as temporaries, weight copies are "
                "autocast's cast weights")
        common = dict(
            params_bytes=params_bytes, grads_bytes=grads, optimizer_bytes=opt,
            activations_bytes=None,
            activations_method="not measured: the run ended before its watched step "
                               f"(step {COUNT_STEP}) ended",
        )
        if peak_alloc is None:
            return MemoryBreakdown(
                **common, total_bytes=known,
                total_method="parameters + gradients + optimizer state, exact tensor bytes "
                             "(no allocator peak counter on the CPU; host RSS is in the "
                             "monitor samples)")
        return MemoryBreakdown(
            **common, peak_allocated_bytes=peak_alloc, peak_reserved_bytes=peak_res,
            temporaries_bytes=None, total_bytes=peak_alloc,
            total_method=f"torch.cuda.max_memory_allocated {covers}")

    def _summary(self) -> TrialSummary:
        tokens = [s.tokens for s in self.steps if not s.warmup]
        # one token count (and one model FLOPs) for every measured step: divided by the
        # median step time, as a profile trial's; where they vary, the steps' own medians
        same_tokens = bool(tokens) and all(tokens) and len(set(tokens)) == 1
        same_flops = len(self._measured_flops) == 1
        return summarise(
            self.steps, tokens_per_step=tokens[0] if same_tokens else None,
            model_flops_per_step=next(iter(self._measured_flops)) if same_flops else None,
            counted_flops_per_step=self._counted.total if self._counted is not None else None,
            peak=self._peak, memory=self._memory(),
            common_peak=peak_choice.common_peak(self.device_info),
            no_steps_reason=(f"no steps measured after the warm-up and FLOP-counting steps "
                             f"(0..{COUNT_STEP})"),
            no_flops_reason=self._flops.analytic_formula if self._flops else "no model FLOPs",
            # a user's loop is not paused for a matmul benchmark: profile trials measure it
            no_measured_peak_reason="MFU vs measured matmul peak is measured by main.py "
                                    "profile trials; a recorded loop divides by the datasheet "
                                    "peak only")
