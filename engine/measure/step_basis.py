"""The profiled step's figures weighed against the measured step.

The profiler slows a step's host side: on an H200 the profiled GPT-2 bf16-amp step took
61.8 ms where the measured median was 24.84 ms, and the table put 73.6% of it in idle
gaps that were mostly the profiler's. The kernels themselves run as in a measured step,
so on a GPU their time is taken from the profile and each share is of the measured
median step: a category's kernel time over the median, idle = the median minus the union
of kernel time. When the profiled kernels' union is more than ``TOLERANCE`` off the
median, the profile says so (``basis_note``). A union a hair above the median but within
the measured steps' own spread (their p90) is the timer's noise: idle is 0, and said. A CPU
run's ops are the host side itself: its shares stay those of the profiled step, and only
the comparison is said.
"""

from __future__ import annotations

import dataclasses
import statistics

from engine.core.events import ProfiledStep

TOLERANCE = 0.10  # beyond it the profiled step's kernel time is said to differ
GPU_BASIS = ("device time of the kernels each op launched in the profiled step "
             "(torch.profiler, CUDA activity; a kernel counts under the innermost CPU op of "
             "any namespace that enclosed its launch, else as unattributed), as shares of the "
             "measured median step ({measured:.2f} ms); idle = that median minus the union of "
             "the kernels' time ({busy:.2f} ms); the profiled step itself took {span:.2f} ms "
             "from its first kernel to its last (the profiler slows the host side)")


def _timed_ms(steps) -> list[float]:
    """The measured (not warm-up, not skipped) steps' times, as the summary takes them."""
    return [s.step_ms for s in steps if not s.warmup and not s.skipped]


def measured_median_ms(steps) -> float | None:
    """The median of the measured steps, as the summary's."""
    timed = _timed_ms(steps)
    return statistics.median(timed) if timed else None


def against_measured_steps(ps: ProfiledStep, steps) -> ProfiledStep:
    """``against_measured`` with the median and the p10/p90 of the measured ``steps``, as
    the summary's spread takes them."""
    import numpy as np

    timed = _timed_ms(steps)
    spread = tuple(float(x) for x in np.percentile(timed, [10, 90])) if timed else None
    return against_measured(ps, measured_median_ms(steps), spread)


def _differs(kernel_ms: float, measured_ms: float, what: str, gpu: bool = True) -> str | None:
    off = (kernel_ms - measured_ms) / measured_ms
    if abs(off) <= TOLERANCE:
        return None
    said = (f"the profiled step's {what} took {kernel_ms:.2f} ms, {off:+.0%} against the "
            f"measured median step ({measured_ms:.2f} ms): ")
    if off > 0:
        return said + ("the profiler slowed it or it did work the measured steps did not; "
                       "read its shares with care")
    if gpu:
        return said + ("the rest of the measured step is time the GPU had nothing to run (it "
                       "waited on the host: launches, Python, synchronisation)")
    # on the CPU the profiled step is the host's work itself: faster means the steps varied
    return said + ("one step against the median of the measured ones, which ran slower "
                   "(other work on this machine's cores, or its clock); read its shares with "
                   "care")


def against_measured(ps: ProfiledStep, measured_ms: float | None,
                     spread_ms: tuple[float, float] | None = None) -> ProfiledStep:
    """``ps`` with its shares of the measured median step ``measured_ms`` (GPU), or the
    comparison only (CPU); ``ps`` as it is when there is no measured step. ``spread_ms``:
    the measured steps' (p10, p90), the tolerance of a kernel union above the median."""
    if measured_ms is None or measured_ms <= 0:
        return ps
    if ps.idle_gap_ms is None:  # a CPU run: its op times are the host side itself
        return dataclasses.replace(ps, measured_step_ms=measured_ms,
                                   profiled_step_ms=ps.step_ms,
                                   basis_note=_differs(ps.step_ms, measured_ms, "wall time",
                                                       gpu=False))
    span = ps.step_ms
    busy = span - ps.idle_gap_ms
    total = sum(ps.category_ms.values()) + ps.idle_gap_ms  # the shares' old denominator
    idle = measured_ms - busy
    note = _differs(busy, measured_ms, "kernels (their union)")
    idle_reason = ps.idle_gap_reason
    basis = GPU_BASIS.format(measured=measured_ms, busy=busy, span=span)
    if idle < 0 and spread_ms and busy <= spread_ms[1]:  # a GPU-bound step, timed with noise
        idle = 0.0
        basis += (f"; the kernels' union is {busy - measured_ms:.2f} ms above the median, "
                  f"within the measured steps' spread (p10 {spread_ms[0]:.2f} ms, p90 "
                  f"{spread_ms[1]:.2f} ms): idle is 0")
    elif idle < 0:
        past = f" and its steps' p90 ({spread_ms[1]:.2f} ms)" if spread_ms else ""
        idle, idle_reason = None, ("the profiled step's kernels took longer than the measured "
                                   f"median step{past}: no idle time to weigh")

    def share(ms):
        return None if ms is None else ms / measured_ms

    return dataclasses.replace(
        ps,
        time_basis=basis,
        step_ms=measured_ms,
        category_share={c: share(ms) for c, ms in ps.category_ms.items()},
        matmul_share_by_dtype={d: share(s * total) for d, s in
                               ps.matmul_share_by_dtype.items() if s is not None},
        ops=[dataclasses.replace(o, step_share=share(o.self_ms)) for o in ps.ops],
        idle_gap_ms=idle,
        idle_gap_share=share(idle),
        idle_gap_reason=idle_reason,
        profiled_step_ms=span,
        kernel_busy_ms=busy,
        measured_step_ms=measured_ms,
        basis_note=note,
    )
