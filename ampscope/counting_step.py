"""The Recorder's counting step (step 1): its hardware FLOPs counted with FlopCounterMode
and its memory watched by engine.measure.memtrack, every storage from allocation to release.

Step 0 warms up (``torch.compile`` compiles there), so step 1 is the first step that runs
as the others do; both are left out of the summary. The watcher enters after the counter
and leaves first, because torch dispatch modes are a stack. An evaluation forward inside
the counting step is not training's: its FLOPs are taken back out. A mixin of
``ampscope.recorder.Recorder``, whose constructor makes the state it reads.
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager

from ampscope.recorder_args import base_optimizer
from engine.measure import flops as flops_mod
from engine.measure import memtrack

COUNT_STEP = 1  # step 0 warms up (and compiles); FLOPs are counted over step 1


class CountingStep:
    """Step 1's FLOP counter and memory watcher (see the module's docstring)."""

    def _begin_count_step(self) -> None:
        """Step 1: FLOPs counted (unless the Trainer scopes the counting) and memory watched;
        the watcher enters after the counter, so it leaves first (modes are a stack)."""
        if self._index != COUNT_STEP or self._finished:
            return
        if self._counter is None and not self.scoped_counting:
            self._start_counting()
        if self._watcher is None:
            watcher = memtrack.MemoryWatcher(self.device)
            watcher.track_training(self.model, base_optimizer(self.optimizer))
            watcher.phase = "data"  # the batch is made before the first forward
            watcher.__enter__()
            self._watcher = watcher

    def _stop_watching(self, completed: bool) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is None:
            return
        base = base_optimizer(self.optimizer)
        if base is not None:
            watcher.mark_optimizer_state(base)
        watcher.__exit__(None, None, None)
        if completed:
            self._measured = watcher.result()

    def _watch_phase(self, phase: str) -> None:
        if self._watcher is not None:
            self._watcher.phase = phase

    def _start_counting(self) -> None:
        """Hardware FLOPs: FlopCounterMode over the counting step, nothing else."""
        self._counter, self._by_dtype = flops_mod.counting_mode(self._tf32)
        self._counter.__enter__()

    def _pause_counting(self) -> None:
        """Leave the counter (its mode is popped), keeping what it counted so far."""
        ops, dtypes = self._tallies()
        self._counter.__exit__(None, None, None)
        self._counter = None
        ops.subtract(self._excluded[0])
        dtypes.subtract(self._excluded[1])
        self._excluded = (Counter(), Counter())
        self._count_ops.update(ops)
        self._count_dtypes.update(dtypes)

    def _stop_counting(self, completed: bool) -> None:
        if self._counter is not None:
            self._pause_counting()
        ops, dtypes = self._count_ops, self._count_dtypes
        self._count_ops, self._count_dtypes = Counter(), Counter()
        if completed and ops:
            self._counted = flops_mod.Counted(
                sum(ops.values()), {k: v for k, v in ops.items() if v > 0},
                {k: v for k, v in sorted(dtypes.items()) if v > 0})

    @contextmanager
    def counting(self):
        """Count the FLOPs of the code inside when it runs in the counting step; the
        Trainer callback wraps each ``training_step`` in it, so no exception can leave
        the counter's dispatch mode pushed."""
        if self._index != COUNT_STEP or self._counter is not None or self._finished:
            yield
            return
        self._start_counting()
        try:
            yield
        finally:
            self._pause_counting()

    def _tallies(self) -> tuple[Counter, Counter]:
        return (Counter({str(op): int(n) for op, n in self._counter.flop_counts["Global"].items()}),
                Counter(self._by_dtype))

    def _stop_counter(self) -> None:
        self._stop_watching(completed=False)  # entered after the counter: leaves first
        if self._counter is not None:  # the run ended inside its counting step
            self._stop_counting(completed=False)
