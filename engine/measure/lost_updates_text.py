"""The lost-updates table for the terminal, the HTML report and the window, and the
explanation of master weights it links to: no torch, so a report opens without it."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from engine.core.events import LostUpdates, TrialResult
from engine.core.text_table import table_lines

TITLE = ("Lost updates: share of one optimiser step that weights stored below fp32 did not "
         "take (elements / update norm; at the configured lr and the schedule's smallest)")
STOCHASTIC = ("adamw-bf16-sr",)  # optimisers that round bf16 weights stochastically
HEADERS = ("precision", "weights", "lost at lr", "lost at min lr", "kept at min lr",
           "worst group at min lr")
# what "master weights" means, in AmpScope's words (the seeds' chapter on mixed precision)
EXPLANATION = (
    "Why updates get lost, and what master weights do. A step adds lr x (Adam's normalised "
    "gradient) to each weight, typically 1e-4 to 1e-6 of it. A number stored in bf16 keeps 8 "
    "significant bits, so the neighbouring values around a weight w lie about w x 2^-8 apart "
    "(fp16: w x 2^-11). An addition smaller than half that gap rounds back to w: the "
    "optimiser computed an update, and the stored weight did not change. A LayerNorm gain of "
    "1.0 plus 3e-3 is 1.0 again in bf16; at a small learning rate most of a model's updates "
    "vanish this way, every step, and the loss stalls while the steps look fast. "
    "Mixed precision (bf16-amp, fp16-amp) keeps an fp32 master copy of every weight: the "
    "update is added in fp32, whose gap is 2^-24 of the weight, and only the forward and "
    "backward matmuls run in 16 bits. Stochastic rounding (bf16+adamw-bf16-sr) keeps bf16 "
    "weights but rounds up with a probability equal to the dropped fraction, so on average "
    "every update lands (a single step may still leave an element unmoved: the kept share "
    "is the figure to read). fp16 weights add a second problem: Adam's epsilon of 1e-8 "
    "rounds to 0 in fp16, so AmpScope raises it to 6.1e-5, a different optimiser.")

SHORT_WHY = ("why: a weight stored in bf16 (fp16) drops an update under about 2^-8 (2^-11) of "
             "itself; bf16-amp and fp16-amp add updates to fp32 master weights, and "
             "+adamw-bf16-sr rounds stochastically so updates land on average (README: Lost "
             "updates)")


def _pair(element: float | None, norm: float | None) -> str:
    if element is None or norm is None:
        return "n/a"
    return f"{element:.1%} / {norm:.1%}"


def worst_group(lu: LostUpdates) -> str:
    """The group that loses the largest share of its update norm at the smallest lr."""
    at_min = [g for g in lu.groups if g.lr == lu.min_lr and g.norm_share is not None]
    if not at_min:
        return "n/a"
    g = max(at_min, key=lambda g: g.norm_share)
    return f"{g.group} {g.norm_share:.0%}"


def lost_rows(trials: Sequence[TrialResult]) -> list[tuple[str, ...]]:
    """Per trial that ran: (precision, weights, at lr, at min lr, kept, worst group), or
    (precision, why n/a)."""
    rows: list = []
    for t in trials:
        if t.status == "unsupported" or (t.lost_updates is None
                                         and t.lost_updates_reason is None):
            continue  # never ran, or an older report / a user's loop: nothing to say
        lu = t.lost_updates
        if lu is None:
            rows.append((t.precision, t.lost_updates_reason))
            continue
        kept = "n/a" if lu.min_lr_kept_share is None else f"{lu.min_lr_kept_share:.2f}"
        rows.append((t.precision, f"{lu.weight_dtype}, {lu.rounding}",
                     _pair(lu.element_share, lu.norm_share) + f" (lr {lu.lr:g})",
                     _pair(lu.min_lr_element_share, lu.min_lr_norm_share)
                     + f" (lr {lu.min_lr:g})", kept, worst_group(lu)))
    return rows


def cell(trial: TrialResult) -> str:
    """One short cell for a trial table: the norm share lost at the smallest lr."""
    lu = trial.lost_updates
    if lu is None:
        return "n/a" if trial.lost_updates_reason else ""
    if lu.rounding == "stochastic":
        kept = lu.min_lr_kept_share
        return "n/a" if kept is None else f"kept {kept:.2f} (SR)"
    share = lu.min_lr_norm_share
    return "n/a" if share is None else f"{share:.0%} at lr {lu.min_lr:g}"


def format_lost_updates(trials: Sequence[TrialResult], width: int = 100) -> str:
    """The terminal's table; "" when no trial has anything to show."""
    rows = lost_rows(trials)
    if not rows:
        return ""
    lines = table_lines(TITLE, HEADERS, rows, width)
    if any(len(r) == len(HEADERS) for r in rows):
        lines += textwrap.wrap(SHORT_WHY, width)
    return "\n".join(lines)


def lost_share(lu: LostUpdates, at_min_lr: bool = True) -> float | None:
    """The share of the update a recipe loses, as the verdict weighs it: the norm share for
    round-to-nearest; for stochastic rounding, which keeps updates on average, what the
    projection misses (1 - kept_share, at least 0)."""
    if lu.rounding == "stochastic":
        kept = lu.min_lr_kept_share if at_min_lr else lu.kept_share
        return None if kept is None else max(0.0, 1.0 - kept)
    return lu.min_lr_norm_share if at_min_lr else lu.norm_share
