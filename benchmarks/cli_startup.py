"""CPU seconds the real ``python3 main.py`` spends on refusals and on ``report``, against
importing torch, measured in one run.

Each command is spawned as a user runs it; its CPU time is that of the whole process tree
(this script makes itself the subreaper on Linux, so a child left behind, such as the
trials' forkserver, is waited for and counted). The ratio to ``python3 -c "import torch"``
from the same run is the figure to compare across machines: a busy machine inflates both.

    python3 benchmarks/cli_startup.py [--repeat 3] [--report FILE]

Goal: every refusal costs under a quarter of importing torch (it imports none).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "tests" / "data" / "h200-2026-11-27" / "reports" / "04-gpt2-fp32.json.gz"
GOAL = 0.25
PR_SET_CHILD_SUBREAPER = 36


def _commands(folder: Path, report: Path) -> dict[str, list[str]]:
    missing = str(folder / "no-such-model")
    return {
        "profile --model <missing>": ["profile", "--model", missing],
        "profile --out <no folder>": ["profile", "--out", str(folder / "none" / "r.json")],
        "profile --precision fp7": ["profile", "--precision", "fp7"],
        "plan --model <missing>": ["plan", "--model", missing],
        "footprint --model <missing>": ["footprint", "--model", missing],
        "numerics --model <missing>": ["numerics", "--model", missing],
        "fit --model <missing>": ["fit", "--model", missing],
        "report <missing>": ["report", str(folder / "none.json")],
        "watch <missing>": ["watch", str(folder / "none.jsonl")],
        "report FILE": ["report", str(report)],
        "report FILE --out x.csv": ["report", str(report), "--out", str(folder / "x.csv")],
        "report FILE --out x.html": ["report", str(report), "--out", str(folder / "x.html")],
        "report FILE --out x.json": ["report", str(report), "--out", str(folder / "x.json")],
    }


def cpu_seconds(argv: list[str], env: dict) -> float:
    """User + system CPU of ``argv`` and every process it left behind."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, check=False, timeout=600)
    while True:  # reap what was re-parented to us (a forkserver outliving its parent)
        try:
            os.wait()
        except ChildProcessError:
            break
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each command")
    parser.add_argument("--report", help="a JSON report or journal for the 'report' rows "
                                         "(default: a real H200 report from tests/data)")
    args = parser.parse_args()
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        report = Path(args.report) if args.report else folder / "h200.json"
        if not args.report:
            import gzip

            report.write_bytes(gzip.decompress(H200.read_bytes()))
        env = {**os.environ, "AMPSCOPE_DATA_DIR": str(folder / "data")}

        def median(argv: list[str]) -> float:
            return statistics.median(cpu_seconds(argv, env) for _ in range(args.repeat))

        torch_s = median([sys.executable, "-c", "import torch"])
        print(f"machine: {os.cpu_count()} CPU cores, load {os.getloadavg()[0]:.2f}, "
              f"median of {args.repeat} runs; import torch: {torch_s:.2f} s CPU")
        worst = 0.0
        for label, command in _commands(folder, report).items():
            seconds = median([sys.executable, "main.py", *command])
            ratio = seconds / torch_s
            if not label.startswith("report FILE"):
                worst = max(worst, ratio)
            print(f"{label:30} {seconds:6.2f} s CPU  {ratio:5.2f} x import torch")
    print(f"goal every refusal < {GOAL} x import torch: "
          f"{'met' if worst < GOAL else 'NOT met'} (worst {worst:.2f} x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
