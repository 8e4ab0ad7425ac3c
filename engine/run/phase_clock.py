"""Where a trial's wall-clock time went, phase by phase, so a slow run says why.

The runner marks the moments it sees (the trial process asked for, its first line of code,
its imports done, the device handed to it, each ``PhaseChanged`` it sends, its result, the
process gone); a phase lasts from its mark to the next one. Every mark is epoch seconds
(``time.time()``) taken in the process where it happens, the child's and the parent's clock
being the same system clock. Interleaved rounds add up per precision.
"""

from __future__ import annotations

# a phase's name in ``TrialResult.phase_times``, by the ``PhaseChanged`` phase that opens it;
# a phase not listed (one added later) keeps its own name
FROM_EVENT = {"probes": "probes", "warm-up": "warm-up", "measuring": "measured",
              "memory step": "memory step", "profiled step": "profiled step"}
SPAWN = "spawn"  # the process asked for, until its first line of code runs
IMPORTS = "imports"  # torch, transformers, the model's class, the engine
WAITING = "waiting"  # a process started early, held until the device is free (off the path)
WEIGHTS_WAIT = "initial weights"  # the first process waited while the run drew the weights
BUILD = "build"  # the device handed over: weights loaded and cast, optimiser, batches
TEARDOWN = "teardown"  # the result sent, until the process is gone
# with a ``waiting`` phase (a process started early) these ran beside the trial before,
# off the run's critical path
EARLY = (SPAWN, IMPORTS, WAITING)

CONVENTION = ("wall-clock seconds (time.time) between the runner's marks: spawn (process "
              "asked for -> its first line), imports (-> ready), waiting (a process started "
              "early, held until the device was free: then spawn, imports and waiting ran "
              "beside the trial before; the first trial's process may wait for the run's initial "
              "weights instead, on the path), build "
              "(device handed over -> FLOP/SQNR probes), probes, warm-up, measured, memory "
              "step, profiled step (-> result sent), teardown (-> process gone); rounds summed")


class PhaseClock:
    """Marks of one trial round; ``times`` turns them into seconds per phase."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, float]] = []

    def mark(self, phase: str, time_s: float | None) -> None:
        if time_s is not None:
            self.marks.append((phase, float(time_s)))

    def event(self, phase: str, time_s: float) -> None:
        """A ``PhaseChanged`` the trial sent."""
        self.mark(FROM_EVENT.get(phase, phase), time_s)

    def times(self, end_s: float) -> dict[str, float]:
        """Seconds per phase, in the order they first began; a phase seen twice adds up."""
        out: dict[str, float] = {}
        ends = [t for _, t in self.marks[1:]] + [end_s]
        for (phase, start), end in zip(self.marks, ends):
            out[phase] = out.get(phase, 0.0) + max(0.0, end - start)
        return out


def add_times(earlier: dict | None, later: dict | None) -> dict | None:
    """Two rounds' phase times summed (``None`` when neither has any)."""
    if not earlier:
        return dict(later) if later else None
    out = dict(earlier)
    for phase, seconds in (later or {}).items():
        out[phase] = out.get(phase, 0.0) + seconds
    return out


def on_path_s(times: dict[str, float]) -> float:
    """Seconds of the phases on the run's critical path: all, but a process started early
    spawned, imported and waited beside the trial before."""
    early = EARLY if WAITING in times else ()
    return sum(s for phase, s in times.items() if phase not in early)
