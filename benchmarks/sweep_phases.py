"""Where a sweep's time goes: the tiny preset through six precisions on the CPU, phase by phase.

Runs ``python main.py profile`` (a fresh CLI process, as a user would) for this checkout
and, with ``--baseline DIR``, for another checkout in the same run, alternating which goes
first when ``--repeat`` is above 1, all sharing one data folder (so the matmul peak is
measured once, in an untimed warm-up run, and cached for all). For each it prints:

- the wall clock of the whole command, and of the measured steps (the sum of their step_ms),
  and their ratio: how much longer the sweep takes than the training it times;
- the journal's coarse phases, summed over trials (the same events in both checkouts):
  start-up and build (a trial's start to its first step), warm-up, measured, memory step,
  profiled step and teardown (to the trial's end), and the rest of the command;
- for a checkout whose report has ``phase_times`` (engine/run/phase_clock.py), the fine
  phases summed over trials (spawn, imports, waiting, build, probes, ...), on and off the
  critical path;
- with a baseline, the speed-up baseline wall / this wall.

    python benchmarks/sweep_phases.py                                 # this checkout only
    python benchmarks/sweep_phases.py --baseline /work/wt/base --repeat 2
    python benchmarks/sweep_phases.py --precisions fp32,fp16-amp  # the window's default run
        # on a CPU without bf16 units (engine.core.config.default_precisions; goal < 90 s)
    python benchmarks/sweep_phases.py --steps 2 --warmup 1 --precisions fp32,bf16  # smoke
    python benchmarks/sweep_phases.py --interleave off   # what the second rounds cost

The other settings default to the window's (batch 4 x 128, 10 measured steps after 2
warm-up, interleaving auto, kernel profile and SQNR pass on).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
SIX = "fp32,tf32,fp16-amp,bf16-amp,fp16,bf16"
COARSE = ("start-up and build", "warm-up", "measured", "memory step",
          "profiled step and teardown", "outside trials")
OPENS = {"warm-up": "warm-up", "measuring": "measured", "memory step": "memory step",
         "profiled step": "profiled step and teardown"}


def run_sweep(checkout: Path, args, data: Path, out: Path) -> float:
    cmd = [sys.executable, "main.py", "profile", "--model", "tiny", "--device", "cpu",
           "--precision", args.precisions, "--steps", str(args.steps), "--warmup",
           str(args.warmup), "--batch-size", str(args.batch_size), "--seq-len",
           str(args.seq_len), "--interleave", args.interleave, "--quiet", "--out", str(out)]
    env = dict(os.environ, AMPSCOPE_DATA_DIR=str(data))
    began = time.perf_counter()
    done = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True,
                          check=False)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: profile failed ({done.returncode}):\n"
                         f"{done.stderr[-3000:]}")
    return wall


def coarse_phases(journal: Path, wall: float) -> dict[str, float]:
    """Seconds per coarse phase from a journal's trial, phase and done lines."""
    lines = [json.loads(x) for x in journal.read_text().splitlines() if x.strip()]
    out = dict.fromkeys(COARSE, 0.0)
    current = None  # (phase, since)
    inside = 0.0
    for line in lines:
        kind, t = line.get("e"), line.get("time_s")
        if kind == "trial":
            current = ("start-up and build", t)
        elif kind == "phase" and current is not None:
            phase = line["phase"]
            out[current[0]] += t - current[1]
            inside += t - current[1]
            if phase == "between rounds":  # this round's process is gone
                current = None
            else:
                current = (OPENS.get(phase, current[0]), t)
        elif kind == "done" and current is not None:
            out[current[0]] += t - current[1]
            inside += t - current[1]
            current = None
    out["outside trials"] = max(0.0, wall - inside)
    return out


def measured_s(report: dict) -> float:
    return sum(s["step_ms"] for t in report["trials"] for s in t.get("steps") or []
               if not s["warmup"]) / 1e3


def fine_phases(report: dict) -> tuple[dict[str, float], float] | None:
    trials = [t for t in report["trials"] if t.get("phase_times")]
    if not trials:
        return None
    sums: dict[str, float] = {}
    early = 0.0
    for t in trials:
        times = t["phase_times"]
        for phase, seconds in times.items():
            sums[phase] = sums.get(phase, 0.0) + seconds
        if "waiting" in times:
            early += sum(times.get(p, 0.0) for p in ("spawn", "imports", "waiting"))
    return sums, early


def one(checkout: Path, args, data: Path, tmp: Path, tag: str) -> dict:
    out = tmp / f"{tag}.json"
    wall = run_sweep(checkout, args, data, out)
    report = json.loads(out.read_text())
    journal = data / "runs" / f"{report['run_id']}.jsonl"
    bad = [t["precision"] for t in report["trials"] if t["status"] != "ok"]
    if bad:
        print(f"  warning: {tag}: trials not ok: {', '.join(bad)}")
    return {"wall": wall, "measured": measured_s(report),
            "coarse": coarse_phases(journal, wall), "fine": fine_phases(report)}


def show(tag: str, runs: list[dict]) -> float:
    wall = statistics.median(r["wall"] for r in runs)
    measured = statistics.median(r["measured"] for r in runs)
    print(f"\n{tag}: wall {wall:.1f} s (median of {len(runs)}), measured steps "
          f"{measured:.2f} s, wall / measured = {wall / measured:.1f}")
    print("  coarse phases, summed over trials (journal events):")
    for phase in COARSE:
        seconds = statistics.median(r["coarse"][phase] for r in runs)
        print(f"    {phase:<28} {seconds:8.2f} s  {seconds / wall:6.1%}  "
              f"{seconds / measured:7.1f}x measured")
    fine = runs[-1]["fine"]
    if fine is not None:
        sums, early = fine
        print("  fine phases (phase_times of the last run, summed over trials):")
        for phase, seconds in sums.items():
            print(f"    {phase:<28} {seconds:8.2f} s  {seconds / measured:7.1f}x measured")
        print(f"    of which beside the trial before (pre-started, off the path): {early:.2f} s")
    return wall


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", type=Path, help="another checkout to run the same sweep with")
    p.add_argument("--precisions", default=SIX)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--repeat", type=int, default=1, help="sweeps per checkout, alternating")
    p.add_argument("--interleave", choices=("auto", "on", "off"), default="auto",
                   help="as main.py profile's (auto: the window's default, 2 rounds here)")
    args = p.parse_args()
    if args.baseline is not None and not (args.baseline / "main.py").is_file():
        print(f"--baseline {args.baseline}: no main.py there: pass a checkout's root folder")
        return 2
    with tempfile.TemporaryDirectory(prefix="ampscope-sweep-") as tmp_name:
        tmp = Path(tmp_name)
        data = tmp / "data"
        print("warm-up run (untimed): the matmul peak is measured once and cached")
        run_sweep(HERE, argparse.Namespace(**{**vars(args), "precisions": "fp32", "steps": 1,
                                              "warmup": 0}), data, tmp / "warm.json")
        ours, base = [], []
        for i in range(args.repeat):
            order = [("this", HERE, ours)]
            if args.baseline is not None:
                order.append(("baseline", args.baseline, base))
            for tag, checkout, sink in (order if i % 2 == 0 else order[::-1]):
                print(f"sweep {i + 1}/{args.repeat}: {tag} ({checkout})", flush=True)
                sink.append(one(checkout, args, data, tmp, f"{tag}-{i}"))
        print(f"\ntiny preset on the CPU, {args.precisions}, {args.steps} measured steps after "
              f"{args.warmup} warm-up, batch {args.batch_size} x {args.seq_len}")
        wall = show(f"this checkout ({HERE})", ours)
        if base:
            base_wall = show(f"baseline ({args.baseline})", base)
            print(f"\nspeed-up baseline / this = {base_wall / wall:.2f}x (goal >= 3x)")
    if hasattr(os, "getloadavg"):
        print(f"1-minute load average at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} "
              "cores (measure on an idle machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
