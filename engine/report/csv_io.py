"""The CSV report: one row per optimiser step of every trial, for spreadsheets and pandas.

Empty cells are values the run could not give (see the JSON report for the reason).
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from engine.compare import record_precisions
from engine.record import RunRecord
from engine.report.atomic import atomic_write

STEP_COLUMNS = (
    "precision",
    "step",
    "warmup",
    "loss",
    "step_ms",
    "tokens_per_s",
    "tflops",
    "mfu",
    "allocated_bytes",
    "reserved_bytes",
    "loss_scale",
    "skipped",
    "grad_norm",
)


def write_csv(record: RunRecord, path: str | os.PathLike) -> Path:
    def write(fh) -> None:
        writer = csv.writer(fh)
        writer.writerow(STEP_COLUMNS)
        for precision in record_precisions(record):
            for step in record.steps(precision):
                writer.writerow(
                    "" if (v := getattr(step, c)) is None else v for c in STEP_COLUMNS
                )

    # the csv module writes its own \r\n line ends; newline="" stops a second translation
    return atomic_write(path, write, newline="")
