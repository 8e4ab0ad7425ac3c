"""Paired rounds in fresh processes, for the overhead benchmarks.

Each round runs both sides (A and B) in processes of their own, so state one side leaves
(allocator caches, compiled graphs, threads, the untimed tail of a trial) never reaches
the other or the next round; the order alternates (AB, BA, AB, ...) so a drifting machine
slows both alike. The figure is the ratio B/A of each round's medians, summarised by their
geometric mean with a percentile-bootstrap 95% interval over the rounds.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np

MIN_ROUNDS = 10  # fewer: the interval is too wide to tell 1% apart; a run says so
RESAMPLES = 10_000


def in_fresh_process(script: str, args: list[str]) -> dict:
    """Run ``script --worker ...`` in a new interpreter; its last stdout line is JSON."""
    done = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                          env=dict(os.environ), check=False)
    if done.returncode != 0:
        raise SystemExit(f"worker {' '.join(args)} failed ({done.returncode}):\n"
                         f"{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def rounds(script: str, a: list[str], b: list[str], count: int, key: str = "ms",
           say=print) -> list[tuple[float, float]]:
    """``count`` rounds of (A, B) in fresh processes, order alternating; (a, b) per round."""
    out = []
    for i in range(count):
        order = (("a", a), ("b", b)) if i % 2 == 0 else (("b", b), ("a", a))
        got = {name: in_fresh_process(script, args)[key] for name, args in order}
        out.append((got["a"], got["b"]))
        say(f"  round {i + 1}/{count} ({'AB' if i % 2 == 0 else 'BA'}): A {got['a']:.3f}, "
            f"B {got['b']:.3f}, B/A {got['b'] / got['a']:.4f}", flush=True)
    return out


def paired_ratio(pairs: list[tuple[float, float]], seed: int = 0) -> tuple[float, float, float]:
    """Geometric mean of B/A over the rounds, and its 95% percentile-bootstrap interval."""
    logs = np.log([b / a for a, b in pairs])
    rng = np.random.default_rng(seed)
    means = rng.choice(logs, size=(RESAMPLES, len(logs)), replace=True).mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return math.exp(logs.mean()), math.exp(low), math.exp(high)


def report(label: str, pairs: list[tuple[float, float]], goal: float) -> str:
    ratio, low, high = paired_ratio(pairs)
    verdict = ("meets" if high <= goal else "misses" if low > goal else "cannot tell against")
    few = (f"; only {len(pairs)} rounds (at least {MIN_ROUNDS} for a verdict)"
           if len(pairs) < MIN_ROUNDS else "")
    return (f"{label} = {ratio:.4f}, 95% interval {low:.4f}..{high:.4f} over {len(pairs)} "
            f"paired rounds in fresh processes: {verdict} the goal <= {goal}{few}")


def load_line() -> str:
    if not hasattr(os, "getloadavg"):
        return ""
    return (f"1-minute load average at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} "
            "cores (measure on an idle machine)")
