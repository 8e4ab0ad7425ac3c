"""The quantisation-error table (per-layer SQNR summarised per trial) for the terminal, the
HTML report and the window: no torch, so a report opens without it."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from engine.core.events import TrialResult
from engine.core.text_table import table_lines

TITLE = ("Quantisation error: SQNR in dB of each matmul layer's weight and input as the "
         "recipe rounds them (median / worst layer; higher is better)")
HEADERS = ("precision", "layers", "weights dB", "inputs dB", "loss vs fp32")
EXACT = "exact"  # every layer's operand already in the format: nothing rounded


def no_number(layers, role: str) -> bool:
    """Whether a layer's ``role`` ("weight" / "input") SQNR is n/a for being no number
    (inf/NaN) rather than exact: a None dB is exact unless its reason says so."""
    return any(getattr(r, f"{role}_db") is None and f"{role} n/a" in (r.reason or "")
               for r in layers)


def layer_db(layer, role: str, digits: int = 2) -> str:
    """One layer's dB as a cell: the number, "n/a" (no number) or ``EXACT``."""
    value = getattr(layer, f"{role}_db")
    if value is not None:
        return f"{value:.{digits}f}"
    return "n/a" if no_number([layer], role) else EXACT


def _pair(q, role: str) -> str:
    median, worst = getattr(q, f"{role}_median_db"), getattr(q, f"{role}_min_db")
    if median is None:
        return "n/a" if no_number(q.layers, role) else EXACT
    return f"{median:.1f} / {worst:.1f}"


def quant_rows(trials: Sequence[TrialResult], loss_diffs: dict[str, float | None]
               ) -> list[tuple[str, ...] | tuple[str, str]]:
    """Per trial that ran: (precision, layers, weights, inputs, loss vs fp32), or
    (precision, why n/a) where it has no quantisation error."""
    rows: list = []
    for t in trials:
        if t.status == "unsupported" or (t.quant_error is None and t.quant_error_reason is None):
            continue  # never ran, or an older report / a user's loop: nothing to say
        q = t.quant_error
        if q is None:
            rows.append((t.precision, f"n/a: {t.quant_error_reason}"))
            continue
        loss = loss_diffs.get(t.precision)
        rows.append((t.precision, str(len(q.layers)), _pair(q, "weight"), _pair(q, "input"),
                     "n/a" if loss is None else f"{loss:+.4f}"))
    return rows


def format_quant_error(trials: Sequence[TrialResult], loss_diffs: dict[str, float | None],
                       width: int = 100) -> str:
    """The terminal's table; "" when no trial has anything to show."""
    rows = quant_rows(trials, loss_diffs)
    if not rows:
        return ""
    lines = table_lines(TITLE, HEADERS, rows, width)
    for t in trials:
        if t.quant_error is not None and t.quant_error.reason:
            lines += textwrap.wrap(f"{t.precision}: {t.quant_error.reason}", width)
    return "\n".join(lines)
