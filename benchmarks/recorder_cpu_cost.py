"""CPU time ampscope.Recorder spends per step, by component: a figure other programs' load
does not change much (the ratio of recorder_overhead.py needs an idle machine).

Runs recorder_overhead.py's model and loop with a Recorder and adds up the CPU time of
each thread inside the Recorder's own code (time.thread_time around its hooks and step;
the monitor thread's CPU clock), over the steps after the warm-up and counting steps.

    python benchmarks/recorder_cpu_cost.py [--steps 30] [--step-ms 195]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from recorder_overhead import SKIP, make_run  # noqa: E402 (sets the data folder)

import ampscope  # noqa: E402
from ampscope.recorder import Recorder  # noqa: E402

cpu_s: dict[str, float] = defaultdict(float)
calls: dict[str, int] = defaultdict(int)


def timed(name: str, fn):
    """``fn`` adding its calling thread's CPU time to ``cpu_s[name]``."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            cpu_s[name] += time.thread_time() - start
            calls[name] += 1

    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--step-ms", type=float, default=None,
                        help="the step time to express the cost against (e.g. the idle "
                             "machine's); the median measured here by default")
    args = parser.parse_args()
    model, opt, batch = make_run(torch.device("cpu"))
    # the main thread's share: the hooks (registered at start, so patched before it)
    for name in ("_on_forward", "_after_forward", "_before_optimizer_step", "step"):
        setattr(Recorder, name, timed(name, getattr(Recorder, name)))
    torch.nn.utils.get_total_norm = timed("grad norm (measured)", torch.nn.utils.get_total_norm)
    rec = ampscope.Recorder(model, opt)
    rec.start()
    monitor = rec._monitor
    monitor.tracker.sample = timed("monitor: host tracker", monitor.tracker.sample)
    monitor.load.sample = timed("monitor: load sampler", monitor.load.sample)
    monitor.emit = timed("monitor: journal write", monitor.emit)
    clock = time.pthread_getcpuclockid(monitor._thread.ident)
    walls = []
    for i in range(SKIP + args.steps):
        if i == SKIP:  # from here on: measured steps only
            cpu_s.clear()
            calls.clear()
            monitor_start, wall_start = time.clock_gettime(clock), time.perf_counter()
        t0 = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        rec.step(loss=loss)
        walls.append(time.perf_counter() - t0)
    monitor_s = time.clock_gettime(clock) - monitor_start
    wall_s = time.perf_counter() - wall_start
    rec.finish()
    steps = args.steps
    measured_ms = statistics.median(walls[SKIP:]) * 1e3
    step_ms = args.step_ms or measured_ms
    print(f"{steps} measured steps, median step {measured_ms:.1f} ms (wall, load-dependent)")
    print("main thread, CPU ms per step:")
    for name in ("_on_forward", "_after_forward", "_before_optimizer_step",
                 "grad norm (measured)", "step"):
        print(f"  {name:28s} {cpu_s[name] / steps * 1e3:7.3f}")
    print(f"monitor thread: {monitor_s / wall_s * 1e3:.2f} CPU ms per second "
          f"({monitor.interval_s ** -1:g} Hz), {monitor_s / steps * 1e3:.3f} ms per step here")
    for name in ("monitor: host tracker", "monitor: load sampler", "monitor: journal write"):
        n = max(calls[name], 1)
        print(f"  {name:28s} {cpu_s[name] / n * 1e3:7.3f} ms a call, {calls[name]} calls")
    main_ms = sum(cpu_s[n] for n in ("_on_forward", "_after_forward",
                                     "_before_optimizer_step", "step")) / steps * 1e3
    per_s = monitor_s / wall_s * 1e3
    print(f"Recorder CPU per step at a {step_ms:.0f} ms step: {main_ms:.2f} ms main thread + "
          f"{per_s * step_ms / 1e3:.2f} ms monitor = "
          f"{100 * (main_ms + per_s * step_ms / 1e3) / step_ms:.2f}% of the step")


if __name__ == "__main__":
    main()
