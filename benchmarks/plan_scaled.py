"""The plan scaled from cut models against the plan traced whole, in one run.

Spawns ``python3 main.py plan`` twice with the same arguments, once as it runs by default
(the model cut to a few repeats of its layers, the figures scaled: engine.run.plan_scale)
and once with ``--full-trace``, and prints each one's wall-clock time, their ratio and the
difference of every recipe's traced peak (what the first line's answer rests on). The
host's load average is printed before and after: a ratio taken under load says so; the
two runs share the same load only roughly.

    python3 benchmarks/plan_scaled.py [--model llama-3-8b] [--precision bf16-amp,nf4] \
        [--card "RTX 4090"] [--seq-len 2048] [--scaled-only]

``--baseline DIR`` also times the same plan in another checkout (``git worktree add
/tmp/base 27a561c``, main before plans were scaled): the issue's goal is this ratio, the
scaled plan against that checkout's plan of the same arguments, in the same run; the ratio
to ``--full-trace`` is printed beside it.

``--scaled-only`` times the scaled plan alone, for models whose full trace is out of reach
on this machine (``--model llama-3-70b --precision fp32,bf16-amp --card "H100 SXM"``, the
plan's defaults). Each plan's CPU seconds (its process's user and system time) are printed
beside its wall-clock time: on a host shared with other work they move less.

Goals (issue #48): the scaled plan at most a quarter of the time 27a561c's plan took,
every peak within 0.5% of the full trace; a 70B or 405B plan within a minute.
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
GOAL_RATIO = 0.25
GOAL_PEAK = 0.005
GOAL_LARGE_S = 60  # a 70B or 405B plan


def load_text() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"


def _child_cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def run_plan(args, full: bool, root: Path = ROOT, name: str = "") -> tuple[float, dict]:
    """(seconds, the plan's JSON) of the checkout at ``root``; prints its wall-clock and
    CPU seconds."""
    command = [sys.executable, "main.py", "plan", "--model", args.model, "--precision",
               args.precision, "--batch-size", "1", "--seq-len", str(args.seq_len),
               "--card", args.card, "--no-history", "--quiet", "--json",
               *(("--full-trace",) if full else ())]
    start, cpu = time.perf_counter(), _child_cpu_s()
    done = subprocess.run(command, cwd=root, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    print(f"  {name or ('full trace' if full else 'scaled')}: {seconds:.1f} s wall, "
          f"{_child_cpu_s() - cpu:.1f} s CPU")
    if done.returncode:
        sys.exit(f"plan failed ({name or ('full' if full else 'scaled')}): "
                 f"{done.stderr.strip().splitlines()[-1:]}")
    return seconds, json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--precision", default="bf16-amp,nf4")
    parser.add_argument("--card", default="RTX 4090")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--scaled-only", action="store_true",
                        help="time the scaled plan alone (no full trace to compare)")
    parser.add_argument("--baseline", type=Path,
                        help="a checkout whose plan of the same arguments is timed too")
    args = parser.parse_args()
    print(f"before: {load_text()}")
    if args.baseline:
        base_s, _ = run_plan(args, False, args.baseline, f"baseline {args.baseline}")
    scaled_s, scaled = run_plan(args, full=False)
    if args.scaled_only:
        print(f"after: {load_text()}")
        print(f"plan {args.model} ({args.precision}, 1 x {args.seq_len}, {args.card}): scaled "
              f"{scaled_s:.1f} s (goal <= {GOAL_LARGE_S} s)")
        for s in scaled["answers"]:
            print(f"  answer: {s['text']}")
        return 0
    full_s, full = run_plan(args, full=True)
    print(f"after: {load_text()}")
    print(f"plan {args.model} ({args.precision}, 1 x {args.seq_len}, {args.card}), levers and "
          "micro-batch search included")
    if args.baseline:
        print(f"  scaled {scaled_s:.1f} s, baseline {base_s:.1f} s: ratio "
              f"{scaled_s / base_s:.3f} (goal <= {GOAL_RATIO})")
    print(f"  scaled {scaled_s:.1f} s, full trace {full_s:.1f} s: ratio "
          f"{scaled_s / full_s:.3f}")
    worst = 0.0
    for s, f in zip(scaled["trials"], full["trials"], strict=True):
        a, b = s["memory"]["total_bytes"], f["memory"]["total_bytes"]
        diff = (a - b) / b
        worst = max(worst, abs(diff))
        print(f"  {s['precision']}: peak scaled {a:,} B, full {b:,} B, difference {diff:+.4%}; "
              f"{s['scaling']}")
    for s, f in zip(scaled["answers"], full["answers"], strict=True):
        print(f"  answer scaled: {s['text']}\n  answer full:   {f['text']}")
    print(f"  worst peak difference {worst:.4%} (goal <= {GOAL_PEAK:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
