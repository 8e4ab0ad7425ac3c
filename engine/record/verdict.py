"""The verdict: which precision to train in, how sure that is, and why.

Pure functions over a run record: its trials, the comparison against the reference (fp32,
else the highest-precision recipe that finished; ``engine.record.compare``: bootstrap CIs
widened by drift, and a speed ranking that refuses only a busy host or too few steps), the
numerics lab's result when it ran, and the device's bf16 support. The rules are ``RULES``;
every figure in the text is a measured one from the comparison table.

Every run that finished a trial answers "Train in X": what could not be judged (speed on a
busy host, the loss when the reference barely learned, compiled trials beside eager ones)
is named, and the answer rests on what could be.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cmp_to_key

from engine.core.config import BF16_COMPUTE, recipe_name
from engine.record import verdict_numerics as vn
from engine.record import verdict_order as order
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
from engine.record.like_with_like import ran_compiled
from engine.record.run_record import RunRecord
from engine.record.verdict_loss import loss_rules
from engine.record.verdict_order import TIE_RULE

LOSS_DROP_SHARE = 0.10  # a loss within 10% of the reference's own drop of its final loss ties
MIN_LOSS_DROP = 0.05  # nats: below this the reference's drop is too small to judge against
LOST_UPDATES_MAX = 0.05  # share of the update's norm a recipe may lose at the smallest lr
MEMORY_MIN_SAVING = 0.05  # a peak at least 5% below the reference's counts as using less
RULES = (
    "the reference is fp32, or where fp32 did not finish the highest-precision recipe that "
    "did; a precision is recommended over it when it finished, trains all weights (int8 and "
    "nf4 train LoRA adapters over a frozen base: compared only with each other), ran as the "
    "reference did (compiled or eager: torch.compile's fused kernels hold less memory and run "
    "faster, so compiled trials are compared, speed and memory, only with compiled ones), its "
    "loss is finite and ends no further above the reference's than the tolerance (the larger "
    f"of {LOSS_DROP_SHARE:.0%} of the reference's own drop and the spread of the reference's "
    "loss: between its rounds where it ran several, else twice the standard deviation of its "
    "step-to-step changes; on held-out batches no step trained on and on the training "
    f"batches; not judged when the reference's drop is under {MIN_LOSS_DROP}; a lower loss is "
    "never held against a recipe); weights stored below fp32 lose at most "
    f"{LOST_UPDATES_MAX:.0%} of an update's norm at the schedule's smallest learning rate "
    "(measured in an untimed step; a report without the measurement recommends no pure "
    "bf16/fp16 weights without an fp32 master copy or stochastic rounding); it is not "
    "significantly slower, and it is either significantly faster (the 95% CI of its speed-up, "
    "widened by each trial's drift between its interleaved rounds, excludes 1.0; judged only "
    "when the run's speeds can be ranked; never for bf16 where the device emulates bf16) or "
    f"its peak memory is at least {MEMORY_MIN_SAVING:.0%} below the reference's. Where speed "
    "cannot be ranked (a busy host, too few steps) the answer rests on memory, loss and lost "
    "updates, and says so. Among several: the faster first, then the one using "
    f"{MEMORY_MIN_SAVING:.0%} less memory, then the numerics lab's choice, then fewer skipped "
    f"steps; {TIE_RULE.format(share=MEMORY_MIN_SAVING)}. Without one, the reference is the "
    "choice"
)


@dataclass(frozen=True)
class VerdictFigure:
    """One precision as the verdict judged it, with the figures the judgement rests on."""

    precision: str
    judgement: str  # recommended, baseline, qualifies, not better, slower, diverged, ...
    note: str  # why, in a phrase
    # "vs fp32": against the verdict's reference (``Verdict.reference``), fp32 where it ran
    speedup_vs_fp32: float | None
    speedup_ci: tuple[float, float] | None
    peak_memory_bytes: int | None
    memory_saved_bytes: int | None  # the reference's peak minus this one's
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
    # the trial every figure's "vs fp32" ratio is against: fp32, or the highest-precision
    # recipe that finished where fp32 did not
    reference: str = "fp32"


def _steps(record: RunRecord, precision: str) -> int:
    trial = record.trial(precision)
    return len(trial.steps) if trial is not None else 0


def _group(speed: SpeedVerdict, precision: str) -> int | None:
    if speed.ranking is None:
        return 0 if speed.status == "tied" else None
    return next((i for i, g in enumerate(speed.ranking) if precision in g), None)


def _speed_text(row: ComparisonRow, ref: str) -> str:
    ci = (f" [{row.speedup_ci[0]:.2f}-{row.speedup_ci[1]:.2f}]" if row.speedup_ci
          else " (no CI: too few steps)")
    return f"{row.speedup_vs_fp32:.2f}x {ref}'s speed{ci}"


def _memory_text(row: ComparisonRow, base: ComparisonRow) -> str:
    if row.peak_memory_bytes is None or not base.peak_memory_bytes:
        return "peak memory n/a"
    saved = base.peak_memory_bytes - row.peak_memory_bytes
    share = saved / base.peak_memory_bytes
    if saved >= 0:
        return f"saves {format_bytes(saved)} ({share:.0%})"
    return f"uses {format_bytes(-saved)} more ({-share:.0%})"


def _loss_text(row: ComparisonRow, steps: int, ref: str) -> str:
    if row.final_loss_diff_vs_fp32 is None:
        return f"loss vs {ref} n/a"
    return f"loss {row.final_loss_diff_vs_fp32:+.3g} vs {ref} after {steps} steps"


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


def _mode(trial) -> str:
    return "compiled" if ran_compiled(trial) else "eager"


def _ruled_out(record: RunRecord, row: ComparisonRow, ref: str, rules, lost,
               speed: SpeedVerdict) -> tuple[str, str] | None:
    """(judgement, note) when the row cannot be recommended whatever its speed and memory."""
    trial, base = record.trial(row.precision), record.trial(ref)
    loss = trial.summary.final_loss if trial.summary else None
    if row.status != "ok":
        return row.status, row.reason or row.status
    if trial.lora is not None and base.lora is None:
        return "LoRA only", "trains LoRA adapters over a frozen base"
    if row.median_step_ms is None:
        return "no step time", "every measured step was skipped"
    if loss is None or not math.isfinite(loss):
        return "diverged", f"final loss is {loss}"
    judged = next((said for rule in rules if (said := rule.judge(record, row))), None)
    if judged is not None:
        return judged
    if lost is not None:
        return lost[:2]
    if row.precision in speed.unmatched:  # torch.compile's memory and speed are not its own
        return "not compared", (
            f"ran {_mode(trial)} while {ref} ran {_mode(base)}: its speed and memory are "
            f"compared only with {_mode(trial)} trials (profile with --compile to compare "
            "every precision compiled)")
    return None


def _unranked(speed: SpeedVerdict) -> str:
    """"speed not ranked: why; what to do", or "" when the run's speeds were ranked."""
    if not speed.noisy:
        return ""
    more = f"; and {len(speed.problems) - 1} more" if len(speed.problems) > 1 else ""
    first = f"{speed.problems[0]}{more}" if speed.problems else speed.text
    why = f"the machine was busy ({first})" if speed.text.startswith(BUSY_TEXT) else first
    todo = f"; {speed.suggestion}" if speed.suggestion else ""
    return f"speed not ranked: {why}{todo}"


def _single(record: RunRecord, ref: str, row: ComparisonRow, reasons: list[str]) -> Verdict:
    others = [p for p in ("fp32", "bf16-amp", "fp16-amp") if p != ref]
    figure = dataclasses.replace(  # nothing to set it against: no ratios
        _figure(row, row, "recommended", "the only precision in this run"),
        speedup_vs_fp32=None, memory_saved_bytes=None, final_loss_diff_vs_fp32=None)
    return Verdict(ref, f"Train in {ref}: the only precision in this run, so nothing was "
                   "compared with it", (figure,), tuple(reasons),
                   f"profile {ref} with {', '.join(others[:-1])} and {others[-1]} (the default "
                   "precisions)", reference=ref)


def verdict(record: RunRecord) -> Verdict:
    """Apply ``RULES`` to the record's finished trials."""
    gated = [f"{t.precision} did not run: {t.reason}" for t in record.trials
             if t.status == "unsupported"]
    if not any(t.status == "ok" for t in record.trials):
        failed = "; ".join(f"{t.precision}: {t.status}" for t in record.trials) or "none ran"
        return _none(f"no trial finished ({failed})",
                     "fix what the trials' reasons say (a smaller batch or model for an "
                     "out-of-memory, precisions this device supports) and profile again",
                     reasons=gated)
    baseline = baseline_label(record)
    ref = order.reference(record, baseline)
    why_no_base = baseline_reason(record) if ref != baseline else None
    if why_no_base:  # every *_vs_fp32 figure below is against ref, said in the headline
        config = record.config if isinstance(record.config, dict) else {}
        record = dataclasses.replace(record, config={**config, "baseline": ref})
    speed = speed_verdict(record.trials, ref)
    rows = {r.precision: r for r in comparison_rows(record, speed)}
    if len(rows) == 1:
        return _single(record, ref, rows[ref], gated)
    base = rows[ref]
    device = record.environment.get("device")
    device = device if isinstance(device, dict) else {}  # older reports: a description
    bf16_emulated = device.get("bf16_hardware") is False
    base_group = None if speed.noisy else _group(speed, ref)
    reasons = [f"speed: {speed.text}", *gated]
    if why_no_base:
        reasons.insert(0, f"reference: {why_no_base}; every ratio is against {ref}, the "
                       "highest-precision recipe that finished")
    if bf16_emulated:
        reasons.append(f"bf16 is emulated on this {device.get('kind', 'device')} (no "
                       "AVX512-BF16/AMX): bf16 recipes are not recommended on speed here")
    lab = _lab_choice(record)
    if lab:
        reasons.append(f"the numerics lab recommends {lab}")
    rules = loss_rules(record, ref, LOSS_DROP_SHARE, MIN_LOSS_DROP)
    reasons.extend(rule.text for rule in rules)
    reasons.extend(vn.changed_optimizers(record))
    excluded: dict[str, str] = {}  # precision: why it is not recommended, for the headline
    figures = {ref: _figure(base, base, "baseline", "the reference every ratio uses")}
    good: list[ComparisonRow] = []
    groups: dict[str, int | None] = {}
    unranked = " (speed not ranked)" if speed.noisy else ""
    for row in rows.values():
        if row.precision == ref:
            continue
        trial = record.trial(row.precision)
        lost = (vn.lost_updates_reason(trial, LOST_UPDATES_MAX) if row.status == "ok"
                else None)
        if lost is not None:  # named in the headline whatever else rules the trial out
            excluded[row.precision] = lost[2]
        out = _ruled_out(record, row, ref, rules, lost, speed)
        if out is not None:
            judgement, note = out
        else:
            # an emulated format (gating) has no speed to judge: memory and loss only
            group = (None if trial.support == "emulated" or speed.noisy
                     else _group(speed, row.precision))
            emulated = bf16_emulated and recipe_name(row.precision) in BF16_COMPUTE
            if emulated and group is not None and base_group is not None:
                group = max(group, base_group)  # never faster on emulated bf16
            groups[row.precision] = group
            # an emulated format's step time is the emulation's: only memory and loss judged
            why = " (emulated: speed not judged)" if trial.support == "emulated" else unranked
            faster = group is not None and base_group is not None and group < base_group
            slower = group is not None and base_group is not None and group > base_group
            smaller = (row.memory_saving_vs_fp32 or 0.0) >= MEMORY_MIN_SAVING
            if slower:
                judgement, note = "slower", f"{_speed_text(row, ref)}, {_memory_text(row, base)}"
            elif faster or smaller:
                judgement = "qualifies"
                note = ("faster" if faster else "uses less memory") + why
                good.append(row)
            else:
                judgement, note = "not better", (
                    f"neither significantly faster nor {MEMORY_MIN_SAVING:.0%} smaller"
                    if not why else f"not {MEMORY_MIN_SAVING:.0%} smaller{why}")
        changed = (vn.changed_optimizer(trial, (record.config or {}).get("optimizer") or "adamw")
                   if row.status == "ok" else None)
        figures[row.precision] = _figure(row, base, judgement,
                                         f"{note}; {changed}" if changed else note)
        if judgement == "not compared":  # its ratios would credit or blame torch.compile
            figures[row.precision] = dataclasses.replace(
                figures[row.precision], speedup_vs_fp32=None, speedup_ci=None,
                memory_saved_bytes=None, memory_saving_vs_fp32=None)
    apart = [p for p, f in figures.items() if f.judgement == "not compared"]
    tail = [vn.excluded_text(excluded),
            f"Not compared: {', '.join(apart)} ({figures[apart[0]].note})" if apart else "",
            f"Compared against {ref}, the highest-precision recipe that finished "
            f"({why_no_base})" if why_no_base else ""]
    caveats = "; ".join(rule.caveat for rule in rules if rule.caveat)
    advice = "; ".join(a for a in (speed.suggestion, why_no_base and
                                   "profile again with fp32 among the precisions") if a)
    if not good:
        # failure reasons are long sentences: the headline names the status, "Why" says more
        others = ", ".join(f"{f.precision} {f.judgement}"
                           + (f" ({f.note})" if f.judgement in ("slower", "diverged") else "")
                           for p, f in figures.items()
                           if p != ref and f.judgement != "not compared")
        faster = "" if speed.noisy else "significantly faster or "
        headline = (f"Train in {ref}: no other precision was {faster}"
                    f"{MEMORY_MIN_SAVING:.0%} smaller without diverging or being slower"
                    + "".join(f"; {s}" for s in (others, caveats, _unranked(speed)) if s))
        figures[ref] = _figure(base, base, "recommended", "nothing beat it")
        return Verdict(ref, ". ".join([headline, *filter(None, tail)]),
                       tuple(figures.values()), tuple(reasons), advice or None, reference=ref)
    deciders = order.deciders(groups, base.peak_memory_bytes, MEMORY_MIN_SAVING, lab,
                              not bf16_emulated)
    ranked = sorted(good, key=cmp_to_key(lambda a, b: order.decide(a, b, deciders)[0]))
    best = ranked[0]
    parts = [_speed_part(record, best, ref, speed, groups, base_group, bf16_emulated),
             _memory_text(best, base), _loss_text(best, _steps(record, best.precision), ref)]
    headline = f"Train in {best.precision}: " + ", ".join(p for p in parts if p)
    headline += f" ({caveats})" if caveats else ""
    headline += f"; {_unranked(speed)}" if speed.noisy else ""
    if len(ranked) > 1:
        headline += "; " + _runner_up(ranked[1], best, groups, deciders)
    figures[best.precision] = _figure(best, base, "recommended", figures[best.precision].note)
    return Verdict(best.precision, ". ".join([headline, *filter(None, tail)]),
                   tuple(figures.values()), tuple(reasons), advice or None, reference=ref)


def _speed_part(record: RunRecord, best: ComparisonRow, ref: str, speed: SpeedVerdict,
                groups: dict, base_group: int | None, bf16_emulated: bool) -> str:
    """The recommended precision's speed in a phrase ("" when speed was not ranked: the
    headline says why after the figures)."""
    if speed.noisy:
        return ""
    if record.trial(best.precision).support == "emulated":
        return f"speed {EMULATED_TEXT}"
    text = _speed_text(best, ref) if best.speedup_vs_fp32 is not None else "speed n/a"
    if bf16_emulated and recipe_name(best.precision) in BF16_COMPUTE:
        return text + " (bf16 emulated here: not judged on speed)"
    if groups[best.precision] == base_group:
        return text + " (not significantly faster)"
    return text


def _runner_up(row: ComparisonRow, best: ComparisonRow, groups: dict, deciders) -> str:
    """Why the next candidate lost, in a phrase: the first criterion that told them apart."""
    _, why = order.decide(best, row, deciders)
    if why == "is slower":
        return f"{row.precision} is slower"
    judged = groups[row.precision] is not None and groups[best.precision] is not None
    # an emulated format or an unranked run has no speed to compare: never "as fast"
    lead = f"{row.precision} is as fast but" if judged else f"{row.precision} (speed not judged)"
    if not judged and not why.startswith("uses "):
        lead += ": where it is alike,"
    return f"{lead} {why}"
