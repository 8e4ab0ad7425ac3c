"""The verdict: which precision to train in, how sure that is, and why (or why none).

Pure functions over a run record: its trials, the comparison against fp32
(``engine.record.compare``: bootstrap CIs and a significance-gated speed ranking that refuses
to rank noisy runs or a busy host), the numerics lab's result when it ran, and the
device's bf16 support. The rules are ``RULES``; every figure in the text is a measured
one from the comparison table.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cmp_to_key

from engine.core.config import BF16_COMPUTE, recipe_name
from engine.record import verdict_numerics as vn
from engine.record.compare import (
    BUSY_TEXT,
    EMULATED_TEXT,
    ComparisonRow,
    SpeedVerdict,
    baseline_label,
    baseline_reason,
    comparison_rows,
    format_bytes,
    speed_verdict,
)
from engine.record.run_record import RunRecord

LOSS_DROP_SHARE = 0.10  # final loss within 10% of fp32's own loss drop of fp32's final loss
MIN_LOSS_DROP = 0.05  # nats: below this fp32's drop is too small to judge a loss against
LOST_UPDATES_MAX = 0.05  # share of the update's norm a recipe may lose at the smallest lr
MEMORY_MIN_SAVING = 0.05  # a peak at least 5% below fp32's counts as using less memory
RULES = (
    "a precision is recommended over fp32 when it finished, trains all weights (int8 and "
    "nf4 train LoRA adapters over a frozen base: not a like-for-like replacement), its "
    f"final loss is finite and within {LOSS_DROP_SHARE:.0%} of fp32's own loss drop of "
    "fp32's final loss (on held-out batches no step trained on; in reports without them, on "
    f"the training batches), not judged when fp32's drop is under {MIN_LOSS_DROP} (too few "
    "steps); weights stored below fp32 lose at most "
    f"{LOST_UPDATES_MAX:.0%} of an update's norm at the schedule's smallest learning rate "
    "(measured in an untimed step; a report without the measurement recommends no pure "
    "bf16/fp16 weights without an fp32 master copy or stochastic rounding); it is not "
    "significantly slower, and it is "
    "either significantly faster (the 95% CI of its speed-up excludes 1.0, judged only when "
    "the run's speeds can be ranked; never for bf16 where the device emulates bf16) or its "
    f"peak memory is at least {MEMORY_MIN_SAVING:.0%} below fp32's. Among several: the "
    "faster first, then the one using less memory, then numerics (the numerics lab's "
    "choice, fewer skipped steps, loss closer to fp32's). Without one, fp32 is the choice"
)


@dataclass(frozen=True)
class VerdictFigure:
    """One precision as the verdict judged it, with the figures the judgement rests on."""

    precision: str
    judgement: str  # recommended, baseline, qualifies, not better, slower, diverged, ...
    note: str  # why, in a phrase
    speedup_vs_fp32: float | None
    speedup_ci: tuple[float, float] | None
    peak_memory_bytes: int | None
    memory_saved_bytes: int | None  # fp32's peak minus this one's
    memory_saving_vs_fp32: float | None
    final_loss_diff_vs_fp32: float | None
    skipped_steps: int | None


@dataclass(frozen=True)
class Verdict:
    precision: str | None  # None: nothing can be recommended (``headline`` says why)
    headline: str
    figures: tuple[VerdictFigure, ...]
    reasons: tuple[str, ...]  # what else the judgement rests on: speed verdict, gating, lab
    advice: str | None  # what to do when nothing can be recommended, or to be surer
    rules: str = RULES


def _steps(record: RunRecord, precision: str) -> int:
    trial = record.trial(precision)
    return len(trial.steps) if trial is not None else 0


def _group(speed: SpeedVerdict, precision: str) -> int | None:
    if speed.ranking is None:
        return 0 if speed.status == "tied" else None
    return next((i for i, g in enumerate(speed.ranking) if precision in g), None)


def _speed_text(row: ComparisonRow) -> str:
    ci = (f" [{row.speedup_ci[0]:.2f}-{row.speedup_ci[1]:.2f}]" if row.speedup_ci
          else " (no CI: too few steps)")
    return f"{row.speedup_vs_fp32:.2f}x fp32's speed{ci}"


def _memory_text(row: ComparisonRow, base: ComparisonRow) -> str:
    if row.peak_memory_bytes is None or not base.peak_memory_bytes:
        return "peak memory n/a"
    saved = base.peak_memory_bytes - row.peak_memory_bytes
    share = saved / base.peak_memory_bytes
    if saved >= 0:
        return f"saves {format_bytes(saved)} ({share:.0%})"
    return f"uses {format_bytes(-saved)} more ({-share:.0%})"


def _loss_text(row: ComparisonRow, steps: int) -> str:
    if row.final_loss_diff_vs_fp32 is None:
        return "loss vs fp32 n/a"
    return f"loss {row.final_loss_diff_vs_fp32:+.3g} vs fp32 after {steps} steps"


def _figure(row: ComparisonRow, base: ComparisonRow, judgement: str, note: str
            ) -> VerdictFigure:
    saved = (base.peak_memory_bytes - row.peak_memory_bytes
             if row.peak_memory_bytes is not None and base.peak_memory_bytes else None)
    return VerdictFigure(row.precision, judgement, note, row.speedup_vs_fp32, row.speedup_ci,
                         row.peak_memory_bytes, saved, row.memory_saving_vs_fp32,
                         row.final_loss_diff_vs_fp32, row.skipped_steps)


def figure_text(f: VerdictFigure) -> str:
    """A precision's figures in a line: speed-up [CI], memory saved, loss, skipped steps."""
    speed = "speed-up n/a" if f.speedup_vs_fp32 is None else f"{f.speedup_vs_fp32:.2f}x" + (
        f" [{f.speedup_ci[0]:.2f}-{f.speedup_ci[1]:.2f}]" if f.speedup_ci else "")
    memory = ("memory n/a" if f.memory_saved_bytes is None else
              f"saves {format_bytes(f.memory_saved_bytes)} ({f.memory_saving_vs_fp32:.0%})"
              if f.memory_saved_bytes >= 0 else
              f"uses {format_bytes(-f.memory_saved_bytes)} more")
    loss = ("loss n/a" if f.final_loss_diff_vs_fp32 is None
            else f"loss {f.final_loss_diff_vs_fp32:+.3g}")
    skipped = "" if not f.skipped_steps else f", {f.skipped_steps} skipped"
    return f"{speed}, {memory}, {loss}{skipped}"


def _lab_choice(record: RunRecord) -> str | None:
    advice = (record.numerics or {}).get("advice") or {}
    return advice.get("recommended")


def _none(headline: str, advice: str | None, figures=(), reasons=()) -> Verdict:
    return Verdict(None, f"No recommendation: {headline}", tuple(figures), tuple(reasons),
                   advice)


def verdict(record: RunRecord) -> Verdict:
    """Apply ``RULES`` to the record's finished trials."""
    speed = speed_verdict(record.trials)
    rows = {r.precision: r for r in comparison_rows(record, speed)}
    gated = [f"{t.precision} did not run: {t.reason}" for t in record.trials
             if t.status == "unsupported"]
    finished = [r for r in rows.values() if r.status == "ok"]
    if not finished:
        failed = "; ".join(f"{r.precision}: {r.status}" for r in rows.values()) or "none ran"
        return _none(f"no trial finished ({failed})",
                     "fix what the trials' reasons say (a smaller batch or model for an "
                     "out-of-memory, precisions this device supports) and profile again",
                     reasons=gated)
    why_no_base = baseline_reason(record)
    only_fp32 = len(rows) == 1 and baseline_label(record) in rows  # said below, with advice
    if why_no_base and not only_fp32:
        return _none(why_no_base, "profile again with fp32 among the precisions",
                     reasons=gated)
    if len(rows) == 1:
        return _none("only fp32 ran, so there is nothing to compare it with",
                     "profile fp32 with bf16-amp and fp16-amp (the default precisions)")
    baseline = baseline_label(record)  # fp32, or the ticked fp32 of a comparison
    base = rows[baseline]
    device = record.environment.get("device")
    device = device if isinstance(device, dict) else {}  # older reports: a description
    bf16_emulated = device.get("bf16_hardware") is False
    base_group = _group(speed, baseline)
    reasons = [f"speed: {speed.text}", *gated]
    if bf16_emulated:
        reasons.append(f"bf16 is emulated on this {device.get('kind', 'device')} (no "
                       "AVX512-BF16/AMX): bf16 recipes are not recommended on speed here")
    lab = _lab_choice(record)
    if lab:
        reasons.append(f"the numerics lab recommends {lab}")
    loss_rule = vn.loss_rule(record, baseline, LOSS_DROP_SHARE, MIN_LOSS_DROP)
    reasons.append(loss_rule.text)
    reasons.extend(vn.changed_optimizers(record))
    excluded: dict[str, str] = {}  # precision: why it is not recommended, for the headline
    figures = {baseline: _figure(base, base, "baseline", "the reference every ratio uses")}
    good: list[ComparisonRow] = []
    groups: dict[str, int | None] = {}
    for row in rows.values():
        if row.precision == baseline:
            continue
        trial = record.trial(row.precision)
        loss = trial.summary.final_loss if trial.summary else None
        lost = (vn.lost_updates_reason(trial, LOST_UPDATES_MAX) if row.status == "ok"
                else None)
        if lost is not None:  # named in the headline whatever else rules the trial out
            excluded[row.precision] = lost[2]
        if row.status != "ok":
            judgement, note = row.status, row.reason or row.status
        elif trial.lora is not None:
            judgement, note = "LoRA only", "trains LoRA adapters over a frozen base"
        elif row.median_step_ms is None:
            judgement, note = "no step time", "every measured step was skipped"
        elif loss is None or not math.isfinite(loss):
            judgement, note = "diverged", f"final loss is {loss}"
        elif loss_rule.judged and loss_rule.diff(record, row) is None:
            judgement, note = "no loss", f"no {loss_rule.source} loss to compare with fp32's"
        elif loss_rule.judged and not abs(loss_rule.diff(record, row)) <= loss_rule.tolerance:
            judgement, note = "learned less", (
                f"{loss_rule.source} loss {loss_rule.diff(record, row):+.3g} vs fp32, beyond "
                f"{LOSS_DROP_SHARE:.0%} of fp32's drop ({loss_rule.tolerance:.3g})")
        elif lost is not None:
            judgement, note = lost[:2]
        else:
            # an emulated format (gating) has no speed to judge: memory and loss only
            group = (None if trial.support == "emulated" or row.precision in speed.unmatched
                     else _group(speed, row.precision))
            emulated = bf16_emulated and recipe_name(row.precision) in BF16_COMPUTE
            if emulated and group is not None and base_group is not None:
                group = max(group, base_group)  # never faster on emulated bf16
            groups[row.precision] = group
            faster = group is not None and base_group is not None and group < base_group
            slower = group is not None and base_group is not None and group > base_group
            smaller = (row.memory_saving_vs_fp32 or 0.0) >= MEMORY_MIN_SAVING
            if slower:
                judgement, note = "slower", f"{_speed_text(row)}, {_memory_text(row, base)}"
            elif faster or smaller:
                judgement, note = "qualifies", "faster" if faster else "uses less memory"
                good.append(row)
            else:
                judgement, note = "not better", ("neither significantly faster nor "
                                                 f"{MEMORY_MIN_SAVING:.0%} smaller")
        changed = (vn.changed_optimizer(trial, (record.config or {}).get("optimizer") or "adamw")
                   if row.status == "ok" else None)
        figures[row.precision] = _figure(row, base, judgement,
                                         f"{note}; {changed}" if changed else note)
    not_rec = vn.excluded_text(excluded)
    if speed.noisy:  # the first problem in the headline, all of them in the reasons
        what = ("speeds not ranked, the machine was busy" if speed.text.startswith(BUSY_TEXT)
                else "step times too noisy to rank")
        more = f"; and {len(speed.problems) - 1} more" if len(speed.problems) > 1 else ""
        first = f" ({speed.problems[0]}{more})" if speed.problems else ""
        unranked = {p: dataclasses.replace(f, judgement="speed not ranked", note=(
            f"{f.note}, but its speed could not be ranked: {what}"))
            for p, f in figures.items() if f.judgement == "qualifies"}
        figures.update(unranked)
        return _none(what + first + (f". {not_rec}" if not_rec else ""), speed.suggestion,
                     tuple(figures.values()), [*speed.problems, *reasons[1:]])

    def better(a: ComparisonRow, b: ComparisonRow) -> int:
        """Negative when ``a`` is the better choice (faster, then smaller, then numerics)."""
        ga, gb = groups[a.precision], groups[b.precision]
        if ga is not None and gb is not None and ga != gb:
            return ga - gb
        pa, pb = a.peak_memory_bytes, b.peak_memory_bytes
        if pa is not None and pb is not None and \
                abs(pa - pb) >= MEMORY_MIN_SAVING * base.peak_memory_bytes:
            return -1 if pa < pb else 1
        ka, kb = numerics_key(a), numerics_key(b)
        return (ka > kb) - (ka < kb)

    def numerics_key(row: ComparisonRow) -> tuple:
        return (row.precision != lab, row.skipped_steps or 0,
                abs(row.final_loss_diff_vs_fp32 or 0.0))

    if not good:
        # failure reasons are long sentences: the headline names the status, "Why" says more
        others = ", ".join(f"{f.precision} {f.judgement}"
                           + (f" ({f.note})" if f.judgement in ("slower", "diverged") else "")
                           for p, f in figures.items() if p != baseline)
        headline = (f"Train in fp32: no other precision was significantly faster or "
                    f"{MEMORY_MIN_SAVING:.0%} smaller without diverging or being slower"
                    + (f"; {others}" if others else ""))
        figures[baseline] = _figure(base, base, "recommended", "nothing beat it")
        headline += f". {not_rec}" if not_rec else ""
        headline += f"; {loss_rule.caveat}" if loss_rule.caveat else ""
        return Verdict(baseline, headline, tuple(figures.values()), tuple(reasons),
                       speed.suggestion)
    ranked = sorted(good, key=cmp_to_key(better))
    best = ranked[0]
    speed_part = (_speed_text(best) if best.speedup_vs_fp32 is not None else "speed n/a")
    if record.trial(best.precision).support == "emulated":
        speed_part = f"speed {EMULATED_TEXT}"
    elif best.precision in speed.unmatched:
        speed_part = "speed not compared (compiled vs eager: not like with like)"
    elif bf16_emulated and recipe_name(best.precision) in BF16_COMPUTE:
        speed_part += " (bf16 emulated here: not judged on speed)"
    elif groups[best.precision] == base_group:
        speed_part += " (not significantly faster)"
    headline = (f"Train in {best.precision}: {speed_part}, {_memory_text(best, base)}, "
                f"{_loss_text(best, _steps(record, best.precision))}")
    headline += f" ({loss_rule.caveat})" if loss_rule.caveat else ""
    if len(ranked) > 1:
        headline += "; " + _runner_up(ranked[1], best, groups, base, lab)
    headline += f". {not_rec}" if not_rec else ""  # why the faster pure recipes lost
    figures[best.precision] = _figure(best, base, "recommended", figures[best.precision].note)
    return Verdict(best.precision, headline, tuple(figures.values()), tuple(reasons),
                   speed.suggestion)


def _runner_up(row: ComparisonRow, best: ComparisonRow, groups: dict, base: ComparisonRow,
               lab: str | None) -> str:
    """Why the next candidate lost, in a phrase."""
    judged = groups[row.precision] is not None and groups[best.precision] is not None
    same_speed = groups[row.precision] == groups[best.precision]
    if not judged:  # an emulated format has no speed to compare: never "as fast"
        lead = f"{row.precision} (speed not judged)"
        same_speed = True
    else:
        lead = (f"{row.precision} is as fast but" if same_speed
                else f"{row.precision} is slower and")
    if row.peak_memory_bytes is not None and best.peak_memory_bytes is not None and \
            row.peak_memory_bytes - best.peak_memory_bytes >= \
            MEMORY_MIN_SAVING * base.peak_memory_bytes:
        return f"{lead} uses {format_bytes(row.peak_memory_bytes - best.peak_memory_bytes)} more"
    if (row.skipped_steps or 0) > (best.skipped_steps or 0):
        return f"{lead} skipped {row.skipped_steps} steps"
    if not same_speed:
        return f"{row.precision} is slower"
    if not judged:
        lead += ": where it is alike,"
    if lab == best.precision:
        return f"{lead} the numerics lab recommends {best.precision}"
    return f"{lead} its loss is further from fp32's"
