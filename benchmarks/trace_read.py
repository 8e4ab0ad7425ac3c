"""Reading a large Chrome trace with ``main.py trace``: peak memory against the file's size.

Writes traces of the requested sizes by repeating the H200's real profiled step (its
events shifted in time, with ids of their own, so the analysis sees one long step), runs
``main.py trace FILE --json`` on each in a fresh process and reads that process's peak
resident memory (ru_maxrss, from os.wait4) and CPU seconds. The line "growth" is the
memory added per MB of trace between the smallest and each larger file: the stream
reader's goal (issue #46) is a few times the file's size at most, where ``json.load``
held about eight and a half. CPU seconds are what the wall time is on an idle machine; the
load average is printed beside them.

    python benchmarks/trace_read.py [--mb 20 200]
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "tests" / "data" / "h200-2026-11-27" / "trace" / "gpt2-bf16-amp-b4x512.trace.json.gz"


def write_trace(path: Path, mb: float) -> int:
    """A trace of about ``mb`` MB: the H200 step repeated; returns its size in bytes."""
    raw = json.loads(gzip.decompress(TRACE.read_bytes()))
    timed = [e for e in raw["traceEvents"] if e.get("ph") == "X"]
    span = max(e["ts"] + e["dur"] for e in timed) - min(e["ts"] for e in timed) + 1000
    ids = 1 + max(int(e.get("args", {}).get(k, 0)) for e in timed
                  for k in ("External id", "correlation"))
    one = len(json.dumps(raw["traceEvents"]))
    with open(path, "w") as f:
        f.write('{"schemaVersion": 1, "traceEvents": [')
        for n in range(max(1, round(mb * 1e6 / one))):
            for i, e in enumerate(raw["traceEvents"]):
                e2 = copy.deepcopy(e)
                if "ts" in e2:
                    e2["ts"] += n * span
                for k in ("External id", "correlation"):
                    if e2.get("args", {}).get(k):
                        e2["args"][k] += n * ids
                f.write(("," if n or i else "") + json.dumps(e2))
        f.write("]}")
    return path.stat().st_size


def measure(path: Path) -> tuple[float, float, int]:
    """(peak MB, CPU seconds, exit code) of ``main.py trace path --json``."""
    proc = subprocess.Popen([sys.executable, "main.py", "trace", str(path), "--json"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode()
    proc.stderr.close()
    if proc.returncode:
        sys.exit(f"trace failed on {path}: {err}")
    return usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, nargs="+", default=[20, 200])
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mb in sorted(args.mb):
            path = Path(tmp) / f"trace-{mb:g}.json"
            size = write_trace(path, mb) / 1e6
            peak, cpu, _ = measure(path)
            path.unlink()
            rows.append((size, peak, cpu))
            print(f"trace {size:8.1f} MB: peak {peak:8.1f} MB, {cpu:6.1f} CPU s", flush=True)
    base_size, base_peak, _ = rows[0]
    for size, peak, _ in rows[1:]:
        print(f"growth {base_size:.0f} -> {size:.0f} MB: "
              f"{(peak - base_peak) / (size - base_size):.2f} MB of memory per MB of trace")


if __name__ == "__main__":
    main()
