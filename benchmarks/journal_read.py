"""Reading a large run journal: seconds and peak memory per 100 MB of journal.

Writes a journal of the requested size the way a long run does (monitor samples several a
second, one step line per optimiser step, a finished trial at the end) with the engine's
own JournalWriter, then times ``read_journal`` and the ``report`` command (journal to JSON)
each in a fresh process, whose peak resident memory (ru_maxrss) and CPU time are read from
the process itself (the CPU seconds are what the wall time is on an idle machine; on a
shared one the wall time grows with the load average printed beside it). Goal (issue #21):
under 10 s and under 300 MB per 100 MB of journal.

    python benchmarks/journal_read.py [--mb 100]
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

READ = """
import resource, sys, time
t = time.perf_counter()
from engine.record.journal import read_journal
record = read_journal(sys.argv[1])
seconds = time.perf_counter() - t
steps = sum(len(record.steps(p)) for p in record.live_steps)
use = resource.getrusage(resource.RUSAGE_SELF)
print(seconds, use.ru_utime + use.ru_stime, use.ru_maxrss * 1024, steps,
      len(record.monitor_samples))
"""

REPORT = """
import resource, sys, time
t = time.perf_counter()
from engine.cli import main
code = main(["report", sys.argv[1], "--out", sys.argv[2]])
use = resource.getrusage(resource.RUSAGE_SELF)
print(time.perf_counter() - t, use.ru_utime + use.ru_stime, use.ru_maxrss * 1024)
sys.exit(code)
"""


def write_journal(path: Path, megabytes: float) -> int:
    """A journal of about ``megabytes`` MB: 20 monitor samples per step, as a 5 Hz poll
    over 4 s steps gives. Returns the number of steps written."""
    from engine.core.events import (
        MonitorSample,
        RunFinished,
        RunStarted,
        StepSample,
        TrialStarted,
    )
    from engine.record.journal import JournalWriter

    writer = JournalWriter(path)
    now = time.time()
    writer.write(RunStarted("bench", {"model": "gpt2", "precisions": ["bf16-amp"],
                                      "batch_size": 8, "seq_len": 1024, "steps": 10,
                                      "warmup": 2}, {}, now))
    writer.write(TrialStarted("bf16-amp", 0, 1, now))
    step = 0
    while path.stat().st_size < megabytes * 1e6:
        for i in range(20):
            writer.write(MonitorSample(now + step * 4 + i * 0.2, "nvml", gpu_util_pct=97.0,
                                       mem_util_pct=41.0, gpu_mem_used_bytes=61_203_283_968,
                                       gpu_mem_total_bytes=85_045_231_616, power_w=612.5,
                                       temperature_c=61.0, sm_clock_mhz=1980.0,
                                       energy_j=1.5e6 + step, process_mem_bytes=60_000_000_000,
                                       cpu_pct=101.0, host_rss_bytes=9_000_000_000,
                                       host_mem_used_bytes=90_000_000_000))
        writer.write(StepSample("bf16-amp", step, step < 2, 3.2 - step * 1e-6, 4012.5,
                                2041.3, 402.1, 0.41, 61_000_000_000, 63_000_000_000, None,
                                False, 0.92, now + step * 4 + 4))
        step += 1
    writer.write(RunFinished("cancelled", now + step * 4 + 5))
    writer.close()
    return step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0, help="journal size in MB")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="ampscope-bench-journal-"))
    os.environ["AMPSCOPE_DATA_DIR"] = str(folder)
    journal = folder / "bench.jsonl"
    steps = write_journal(journal, args.mb)
    size_mb = journal.stat().st_size / 1e6
    print(f"journal: {size_mb:,.1f} MB, {steps:,} steps; load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    out = subprocess.run([sys.executable, "-c", READ, str(journal)], capture_output=True,
                         text=True, check=True, cwd=ROOT)
    seconds, cpu, peak, read_steps, samples = out.stdout.split()
    per = 100 / size_mb
    print(f"read_journal: {float(seconds):.1f} s ({float(cpu):.1f} s of CPU), peak "
          f"{int(peak) / 2**20:,.0f} MiB ({float(seconds) * per:.1f} s, {float(cpu) * per:.1f} "
          f"s of CPU and {int(peak) / 2**20 * per:,.0f} MiB per 100 MB); "
          f"{int(read_steps):,} steps, {int(samples):,} monitor samples")
    report = folder / "report.json"
    done = subprocess.run([sys.executable, "-c", REPORT, str(journal), str(report)],
                          capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        print(done.stderr)
        return 1
    seconds, cpu, peak = done.stdout.split()[-3:]
    seconds, cpu, peak_mib = float(seconds), float(cpu), int(peak) / 2**20
    print(f"report to JSON (the CLI's main): {seconds:.1f} s ({cpu:.1f} s of CPU), peak "
          f"{peak_mib:,.0f} MiB ({seconds * per:.1f} s, {cpu * per:.1f} s of CPU and "
          f"{peak_mib * per:,.0f} MiB per 100 MB); report {report.stat().st_size / 1e6:,.1f} MB; "
          f"load average now {os.getloadavg()[0]:.2f}")
    json.loads(report.read_text())  # it is a report the window can open
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
