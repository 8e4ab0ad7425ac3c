"""How long a plan takes, and how much host memory it needs, per recipe.

Spawns ``python3 main.py plan`` once per recipe (each in a fresh process, so its peak
resident memory is its own, with no look into the run history) and reads the wall-clock
time, the trace's own time (the plan's ``trace_s``: one traced step) and the child's peak
RSS (``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`` after it ends, Linux: KiB). The
wall-clock time includes the interpreter's start-up and imports. The host's load average
and core count are printed before and after: a figure taken under load says so.

    python3 benchmarks/plan_speed.py [--model llama-3-8b] [--seq-len 2048] \
        [--precision fp32,bf16-amp] [--levers]

``--levers`` also plans the changes that would make a recipe fit (the plan's answer); by
default only the traced recipe is timed (``--no-levers``).

Goals (issues #18, #29): under 60 s per recipe for Llama 3 8B at 2048 tokens on a 2-core
machine left idle, and under 2 GiB of host memory (fake tensors allocate nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = 60.0
GOAL_RSS_BYTES = 2 * 2**30


def load_text() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"


def run_one(model: str, precision: str, seq_len: int,
            levers: bool = False) -> tuple[float, float | None, int, int]:
    """(seconds, the trace's own seconds, peak RSS bytes of the child, exit status)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "main.py", "plan", "--model", model, "--precision",
                           precision, "--batch-size", "1", "--seq-len", str(seq_len),
                           "--max-batch", "0", "--no-history", "--quiet", "--json",
                           *(() if levers else ("--no-levers",))], cwd=ROOT,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    trace_s = json.loads(done.stdout)["trials"][0]["trace_s"] if done.returncode == 0 else None
    # ru_maxrss of children is the largest of any child so far: each run must beat the last
    # to show, so the figure is an upper bound for a later, smaller run
    rss = max(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, before) * 1024
    if done.returncode:
        print(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed",
              file=sys.stderr)
    return seconds, trace_s, rss, done.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--precision", default="fp32,bf16-amp")
    parser.add_argument("--levers", action="store_true",
                        help="time the plan's answer too (the changes that would make it fit)")
    args = parser.parse_args()
    print(f"before: {load_text()}")
    worst = 0
    for precision in args.precision.split(","):
        seconds, trace_s, rss, status = run_one(args.model, precision, args.seq_len,
                                                args.levers)
        ok = status == 0 and seconds < GOAL_S and rss < GOAL_RSS_BYTES
        worst |= not ok
        traced = "" if trace_s is None else f", of which the traced step {trace_s:.1f} s"
        print(f"{args.model} {precision} 1x{args.seq_len}: {seconds:.1f} s{traced} (goal < "
              f"{GOAL_S:.0f} s), peak host memory <= {rss / 2**30:.2f} GiB (goal < 2 GiB)"
              f"{'' if status == 0 else f', exit {status}'}{'' if ok else '  MISSED'}")
    print(f"after: {load_text()}")
    return int(worst)


if __name__ == "__main__":
    sys.exit(main())
