"""Does ``main.py profile`` with its defaults answer, and how long does it take? (issue #44)

Runs ``python main.py profile --model tiny --device cpu --out report.json`` (a fresh CLI
process, the defaults otherwise: fp32, bf16-amp and fp16-amp, default data, steps and
rounds) ``--repeat`` times in a row, all sharing one data folder whose matmul peak is
measured once first, in an untimed run. For each it prints the wall clock, the load average
before and after (``os.getloadavg``, on the machine's core count), the verdict's headline
and whether it names a precision; then the slowest and the count that answered. The goal:
every run names a precision, each within 30 s on an idle machine.

    python benchmarks/default_verdict.py              # 2 runs
    python benchmarks/default_verdict.py --repeat 4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 30.0


def _profile(out: Path, env: dict) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "main.py", "profile", "--model", "tiny", "--device", "cpu",
                    "--quiet", "--out", str(out)], cwd=ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))  # run as a script from any folder
    from engine.record.json_report import read_json
    from engine.record.verdict import verdict

    with tempfile.TemporaryDirectory() as folder:
        env = dict(os.environ, AMPSCOPE_DATA_DIR=folder, AMPSCOPE_CACHE_DIR=folder)
        subprocess.run([sys.executable, "main.py", "profile", "--model", "tiny", "--device",
                        "cpu", "--precision", "fp32", "--steps", "1", "--warmup", "1",
                        "--quiet"], cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        cores, walls, answered = os.cpu_count(), [], 0
        for i in range(args.repeat):
            out = Path(folder) / f"r{i}.json"
            load_before = os.getloadavg()[0]
            wall = _profile(out, env)
            headline = verdict(read_json(out)).headline
            names = headline.startswith("Train in ")
            walls.append(wall)
            answered += names
            print(f"run {i + 1}: {wall:.1f} s (load {load_before:.2f} -> "
                  f"{os.getloadavg()[0]:.2f} on {cores} cores), "
                  f"{'names a precision' if names else 'NO ANSWER'}: {headline}")
        print(json.dumps({"runs": args.repeat, "answered": answered,
                          "slowest_s": round(max(walls), 1), "goal_s": GOAL_S}))


if __name__ == "__main__":
    main()
