"""The CSV report: one row per optimiser step of every trial, for spreadsheets and pandas.

Empty cells are values the run could not give (see the JSON report for the reason).
Beside it, ``<name>.comparison.csv`` holds the comparison table (one row per
precision, with the step-time spread, confidence intervals and the speed verdict).
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from engine.core.atomic import atomic_write
from engine.record.compare import COLUMNS, comparison_rows, record_precisions, speed_verdict
from engine.record.run_record import RunRecord

STEP_COLUMNS = (
    "precision",
    "step",
    "warmup",
    "loss",
    "step_ms",
    "tokens_per_s",
    "tflops",
    "mfu",
    "mfu_measured",
    "allocated_bytes",
    "reserved_bytes",
    "loss_scale",
    "skipped",
    "grad_norm",
    "round",
    "tokens",
    "learning_rate",
    "data_ms",
    "forward_ms",
    "backward_ms",
    "optimizer_ms",
    "eval_ms",
    "save_ms",
)


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _inert(value: object) -> object:
    """A text cell a spreadsheet would run as a formula (a precision or model named
    ``=cmd|...``) is written with a leading apostrophe; numbers are left as they are."""
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value


def write_csv(record: RunRecord, path: str | os.PathLike) -> Path:
    def write(fh) -> None:
        writer = csv.writer(fh)
        writer.writerow(STEP_COLUMNS)
        for precision in record_precisions(record):
            for step in record.steps(precision):
                writer.writerow(
                    "" if (v := getattr(step, c)) is None else _inert(v) for c in STEP_COLUMNS
                )

    # the csv module writes its own \r\n line ends; newline="" stops a second translation
    atomic_write(comparison_path(path), lambda fh: _write_comparison(record, fh), newline="")
    return atomic_write(path, write, newline="")


def comparison_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(f"{path.stem}.comparison{path.suffix}")


# range cells become two columns each, so a spreadsheet reads them as numbers
RANGE_COLUMNS = {
    "step_ms_p10_p90": ("step_ms_p10", "step_ms_p90"),
    "tokens_per_s_ci": ("tokens_per_s_ci_low", "tokens_per_s_ci_high"),
    "speedup_ci": ("speedup_ci_low", "speedup_ci_high"),
}


def comparison_header() -> list[str]:
    return [name for key, _, _ in COLUMNS
            for name in RANGE_COLUMNS.get(key, (key,))] + ["run_speed_verdict"]


def _cells(key: str, value) -> list:
    if key in RANGE_COLUMNS:
        return ["", ""] if value is None else [value[0], value[1]]
    return ["" if value is None else value]


def _write_comparison(record: RunRecord, fh) -> None:
    verdict = speed_verdict(record.trials)
    writer = csv.writer(fh)
    writer.writerow(comparison_header())
    for row in comparison_rows(record, verdict):
        writer.writerow([_inert(c) for key, _, _ in COLUMNS for c in _cells(key, getattr(row, key))]
                        + [_inert(verdict.text)])
