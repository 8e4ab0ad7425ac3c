"""Checks that a CPU `profile` run filled every table: used by scripts/test_oldest.sh on the
oldest tested torch and transformers, where a missing profiler field or API shows up as an
empty table rather than a failed run.

    python3 scripts/check_tables.py REPORT.json PROFILE_OUTPUT.txt

Exits 1 naming each trial and table that is empty or failed.
"""

from __future__ import annotations

import json
import sys

# what each finished trial must carry, and the quantisation error for recipes that round
REQUIRED = ("memory", "predicted_memory", "flops", "summary", "profiled_step")
ROUNDING = ("bf16-amp", "fp16-amp", "fp8")


def problems(report: dict, output: str) -> list[str]:
    found = []
    if not report["trials"]:
        found.append("no trials")
    for trial in report["trials"]:
        name = trial["precision"]
        if trial["status"] != "ok":
            found.append(f"{name}: status {trial['status']} ({trial.get('reason')})")
            continue
        for key in REQUIRED:
            if not trial.get(key):
                why = trial.get(f"{key}_reason") or "no reason given"
                found.append(f"{name}: {key} is empty ({why})")
        if not (trial.get("flops") or {}).get("counted_per_step"):
            found.append(f"{name}: no counted FLOPs")
        if (trial.get("summary") or {}).get("median_step_ms") is None:
            found.append(f"{name}: no median step time")
        if name in ROUNDING and not trial.get("quant_error"):
            found.append(f"{name}: no quantisation error ({trial.get('quant_error_reason')})")
    for marker in ("failed:", "Traceback"):
        if marker in output:
            line = next(x for x in output.splitlines() if marker in x)
            found.append(f"the CLI's output says {line.strip()!r}")
    return found


def main(argv: list[str]) -> int:
    with open(argv[0], encoding="utf-8") as fh:
        report = json.load(fh)
    with open(argv[1], encoding="utf-8") as fh:
        output = fh.read()
    found = problems(report, output)
    for line in found:
        print(f"check_tables: {line}")
    if not found:
        print(f"every table filled for {', '.join(t['precision'] for t in report['trials'])}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
