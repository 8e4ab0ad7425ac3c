"""Memory a CPU op allocates and frees inside itself, which a dispatch mode never sees.

A bf16 ``mm`` on the CPU computes into an fp32 buffer of its output's shape and copies it
out (T5 pure bf16's LM-head gradient: 268,928 B inside one op at 2 x 32): the watcher
sees the op's output only. The allocator's own events (torch.profiler with
``profile_memory``) see the buffer; each op the watcher dispatches runs inside a
numbered record_function, so the highest net bytes the allocator handed out during that
op can be read back per op once the step ends.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

import torch

PREFIX = "ampscope.op."


class OpScratch:
    """Records the CPU allocator's events over a watched step, one range per op."""

    def __init__(self):
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)

    @staticmethod
    def available() -> bool:
        """Not inside another profile (kineto runs one at a time)."""
        return not torch.autograd.profiler._is_profiler_enabled

    def __enter__(self):
        self._prof.__enter__()
        return self

    def __exit__(self, *exc):
        return self._prof.__exit__(*exc)

    @staticmethod
    def around(index: int):
        return torch.profiler.record_function(f"{PREFIX}{index}")

    def highs(self) -> dict[int, int]:
        """Op index -> the highest net bytes the allocator handed out while it ran."""
        from torch.autograd import DeviceType

        events = list(self._prof.profiler.kineto_results.events())
        mem = sorted((e.start_ns(), e.nbytes()) for e in events
                     if e.name() == "[memory]" and e.device_type() == DeviceType.CPU)
        times = [t for t, _ in mem]
        found = {}
        for e in events:
            if not e.name().startswith(PREFIX):
                continue
            net = top = 0
            for _, n in mem[bisect_left(times, e.start_ns()):bisect_right(times, e.end_ns())]:
                net += n
                top = max(top, net)
            if top:
                found[int(e.name()[len(PREFIX):])] = top
        return found
