"""The comparison table: one row per precision, set against the fp32 baseline.

The CLI prints it, the CSV and HTML reports carry it and the window shows it, all
from ``COLUMNS`` so the headers and number formats agree everywhere. The baseline is
the fp32 trial and only when it finished ok; without one the ``*_vs_fp32`` cells are
``None`` and ``baseline_reason`` says why — another precision is never used instead,
because a ratio against bf16 read as "vs fp32" would be a wrong number.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from engine.events import TrialResult
from engine.record import RunRecord

BASELINE = "fp32"


@dataclass(frozen=True)
class ComparisonRow:
    precision: str
    status: str
    reason: str | None
    trained: str | None  # "all weights", or "LoRA adapters only" with the trainable count
    median_step_ms: float | None
    tokens_per_s: float | None
    speedup_vs_fp32: float | None  # fp32 median step time / this one's
    mfu: float | None  # model FLOPs (no recompute) / time / the device's (blended) peak
    hfu: float | None  # hardware FLOPs (counted, recompute included) / time / the same peak
    peak_memory_bytes: int | None
    memory_saving_vs_fp32: float | None  # fraction: 1 - peak / fp32 peak
    skipped_steps: int | None
    final_loss_diff_vs_fp32: float | None  # final loss minus fp32's final loss


def baseline_trial(record: RunRecord) -> TrialResult | None:
    """The fp32 trial when it finished ok, else None."""
    trial = record.trial(BASELINE)
    return trial if trial is not None and trial.status == "ok" else None


def baseline_reason(record: RunRecord) -> str | None:
    """Why the ``*_vs_fp32`` columns are n/a, or None when there is a baseline."""
    trial = record.trial(BASELINE)
    if trial is None:
        return "no fp32 trial in this run: add fp32 to the precisions to compare against it"
    if trial.status != "ok":
        why = f": {trial.reason}" if trial.reason else ""
        return f"the fp32 trial ended '{trial.status}'{why}, so there is no baseline"
    return None


def record_precisions(record: RunRecord) -> list[str]:
    """The order every view lists precisions in: finished trials as they ran, then live ones."""
    done = [t.precision for t in record.trials]
    return done + [p for p in record.live_steps if p not in done]


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def _row(trial: TrialResult, base: TrialResult | None) -> ComparisonRow:
    s = trial.summary
    b = base.summary if base is not None else None
    step_ms = s.median_step_ms if s else None
    peak = s.peak_memory_bytes if s else None
    final_loss = s.final_loss if s else None
    speedup = _ratio(b.median_step_ms, step_ms) if b else None
    peak_share = _ratio(peak, b.peak_memory_bytes) if b else None
    loss_diff = None
    if b is not None and final_loss is not None and b.final_loss is not None:
        loss_diff = final_loss - b.final_loss
    return ComparisonRow(
        precision=trial.precision,
        status=trial.status,
        reason=trial.reason,
        trained=trained_text(trial),
        median_step_ms=step_ms,
        tokens_per_s=s.tokens_per_s if s else None,
        speedup_vs_fp32=speedup,
        mfu=s.mfu if s else None,
        hfu=s.hfu if s else None,
        peak_memory_bytes=peak,
        memory_saving_vs_fp32=None if peak_share is None else 1.0 - peak_share,
        skipped_steps=s.skipped_steps if s else None,
        final_loss_diff_vs_fp32=loss_diff,
    )


def trained_text(trial: TrialResult) -> str | None:
    """What the trial trained: int8 and nf4 train LoRA adapters on a frozen base."""
    if not trial.param_count:
        return None
    if trial.lora is None:
        return f"all weights ({trial.trainable_params:,})"
    return f"LoRA adapters only ({trial.trainable_params:,}, r={trial.lora['r']})"


def comparison_rows(record: RunRecord) -> list[ComparisonRow]:
    """One row per finished trial, in the order the trials ran."""
    base = baseline_trial(record)
    return [_row(trial, base) for trial in record.trials]


# --- formatting ----------------------------------------------------------------------


def _significant(value: float, digits: int = 3) -> str:
    """``value`` with about ``digits`` significant digits and no exponent."""
    if value == 0 or not math.isfinite(value):
        return str(value)
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}"


def format_bytes(value: float) -> str:
    """Binary units, as the allocator and nvidia-smi count: ``1.23 GiB``."""
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024:
            return f"{size:.0f} B" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    return f"{size:.2f} TiB"


def _percent(value: float) -> str:
    return f"{value * 100:.1f}%"


def _tokens(value: float) -> str:
    return f"{value:,.0f} tok/s" if abs(value) >= 100 else f"{_significant(value)} tok/s"


Formatter = Callable[[object], str]

COLUMNS: list[tuple[str, str, Formatter]] = [
    ("precision", "Precision", str),
    ("status", "Status", str),
    ("trained", "Trained params", str),
    ("median_step_ms", "Step time", lambda v: f"{_significant(v)} ms"),
    ("tokens_per_s", "Throughput", _tokens),
    ("speedup_vs_fp32", "Speed-up vs fp32", lambda v: f"{v:.2f}x"),
    ("mfu", "MFU (model FLOPs)", _percent),
    ("hfu", "HFU (hardware FLOPs)", _percent),
    ("peak_memory_bytes", "Peak memory", format_bytes),
    ("memory_saving_vs_fp32", "Memory saved vs fp32", _percent),
    ("skipped_steps", "Skipped steps", lambda v: f"{v:d}"),
    ("final_loss_diff_vs_fp32", "Final loss vs fp32", lambda v: f"{v:+.4f}"),
    ("reason", "Reason", str),
]
"""(row field, header, formatter of a non-None value), in display order."""

_FORMATTERS = {key: fmt for key, _, fmt in COLUMNS}
_TEXT_KEYS = {"precision", "status", "trained", "reason"}


def format_cell(key: str, value) -> str:
    """Text for one cell: "n/a" for a missing number, "" for a missing reason."""
    if value is None:
        return "" if key in _TEXT_KEYS else "n/a"
    return _FORMATTERS[key](value)


def format_table(rows: list[ComparisonRow]) -> str:
    """A plain aligned text table: text left-aligned, numbers right-aligned."""
    headers = [header for _, header, _ in COLUMNS]
    cells = [[format_cell(key, getattr(row, key)) for key, _, _ in COLUMNS] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    def line(values: list[str]) -> str:
        parts = [
            v.ljust(w) if key in _TEXT_KEYS else v.rjust(w)
            for (key, _, _), v, w in zip(COLUMNS, values, widths)
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in cells)])
