"""How long a plan takes, and how much host memory it needs, per recipe.

Spawns ``python3 main.py plan`` once per recipe (each in a fresh process, so its peak
resident memory is its own, with no look into the run history) and reads the wall-clock
time and the child's peak RSS (``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`` after it
ends, Linux: KiB). The time includes the interpreter's start-up and imports.

    python3 benchmarks/plan_speed.py [--model llama-3-8b] [--seq-len 2048] \
        [--precision fp32,bf16-amp]

Goals (issue #18): under 60 s per recipe for Llama 3 8B at 2048 tokens on a 2-core
machine, and under 2 GiB of host memory (fake tensors allocate nothing).
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = 60.0
GOAL_RSS_BYTES = 2 * 2**30


def run_one(model: str, precision: str, seq_len: int) -> tuple[float, int, int]:
    """(seconds, peak RSS bytes of the child, exit status)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "main.py", "plan", "--model", model, "--precision",
                           precision, "--batch-size", "1", "--seq-len", str(seq_len),
                           "--max-batch", "0", "--no-history", "--quiet"], cwd=ROOT,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    # ru_maxrss of children is the largest of any child so far: each run must beat the last
    # to show, so the figure is an upper bound for a later, smaller run
    rss = max(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, before) * 1024
    if done.returncode:
        print(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed",
              file=sys.stderr)
    return seconds, rss, done.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--precision", default="fp32,bf16-amp")
    args = parser.parse_args()
    worst = 0
    for precision in args.precision.split(","):
        seconds, rss, status = run_one(args.model, precision, args.seq_len)
        ok = status == 0 and seconds < GOAL_S and rss < GOAL_RSS_BYTES
        worst |= not ok
        print(f"{args.model} {precision} 1x{args.seq_len}: {seconds:.1f} s (goal < {GOAL_S:.0f}"
              f" s), peak host memory <= {rss / 2**30:.2f} GiB (goal < 2 GiB)"
              f"{'' if status == 0 else f', exit {status}'}{'' if ok else '  MISSED'}")
    return int(worst)


if __name__ == "__main__":
    sys.exit(main())
