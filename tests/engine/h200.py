"""The real H200 reports of 2026-11-27 (tests/data/h200-2026-11-27/reports, gzip-compressed):
read as the engine reads a report, and their raw JSON where a test needs what the reader
repairs (NVML GPM's NaN)."""

import gzip
import json
from functools import cache
from pathlib import Path

from engine.record.json_report import parse_report

REPORTS = Path(__file__).resolve().parents[1] / "data" / "h200-2026-11-27" / "reports"
SWEEP = "01-gpt2-fp32_tf32_fp16-amp_bf16-amp_fp16_bf16.json"


def _text(name: str) -> str:
    return gzip.decompress((REPORTS / f"{name}.gz").read_bytes()).decode("utf-8")


@cache
def report(name: str):
    """The report ``name`` (e.g. "02-gpt2-bf16-amp.json") as a RunRecord."""
    return parse_report(_text(name), name)


def raw(name: str) -> dict:
    """The report's JSON as written, NaN literals included."""
    return json.loads(_text(name))
