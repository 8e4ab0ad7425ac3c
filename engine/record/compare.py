"""The comparison table: one row per precision, set against the fp32 baseline.

The CLI prints it, the CSV and HTML reports carry it and the window shows it, all
from ``COLUMNS`` so the headers and number formats agree everywhere. The baseline is
the fp32 trial and only when it finished ok; without one the ``*_vs_fp32`` cells are
``None`` and ``baseline_reason`` says why — another precision is never used instead,
because a ratio against bf16 read as "vs fp32" would be a wrong number.

Every speed figure carries its spread (p10..p90, CV, bootstrap CIs: conventions in
``engine/record/spread.py``), and ``speed_verdict`` decides whether the run can rank the
precisions at all (``NOISY_RULE``): drift between interleaved rounds widens the CIs, and
only a run too short or too spread within a round to bound, or on a busy host, says so
instead of ranking.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

from engine.core.events import TrialResult
from engine.measure.contention import CONTENTION_RULE, contention_problems
from engine.measure.lost_updates_text import cell as lost_cell
from engine.record import like_with_like, spread
from engine.record.run_record import RunRecord

BASELINE = "fp32"


@dataclass(frozen=True)
class ComparisonRow:
    precision: str
    status: str
    reason: str | None
    trained: str | None  # "all weights", or "LoRA adapters only" with the trainable count
    median_step_ms: float | None
    step_ms_p10_p90: tuple[float, float] | None
    step_ms_cv: float | None  # sample std / mean of the measured step times
    tokens_per_s: float | None
    tokens_per_s_ci: tuple[float, float] | None  # bootstrap CI at spread.CI_LEVEL
    speedup_vs_fp32: float | None  # fp32 median step time / this one's
    speedup_ci: tuple[float, float] | None  # bootstrap CI of that ratio
    speed_verdict: str | None  # is the speed-up significant? (see speed_verdict)
    mfu: float | None  # model FLOPs (no recompute) / time / the device's (blended) datasheet peak
    mfu_measured: float | None  # the same over this machine's measured matmul peak
    hfu: float | None  # hardware FLOPs (counted, recompute included) / time / the same peak
    peak_memory_bytes: int | None
    memory_saving_vs_fp32: float | None  # fraction: 1 - peak / fp32 peak
    skipped_steps: int | None
    final_loss_diff_vs_fp32: float | None  # final loss minus fp32's final loss
    # GPU energy per token over fp32's (NVML energy counter); None without a counter
    energy_per_token_vs_fp32: float | None = None
    # the share of an update 16-bit weights lost at the smallest lr (lost_updates_text.cell)
    lost_updates: str | None = None
    # whether the timed steps ran under torch.compile; None: not known (older reports)
    compiled: bool | None = None
    # model FLOPs / time / one peak for every recipe (engine.measure.peaks.COMMON_CONVENTION)
    mfu_common: float | None = None


def baseline_label(record: RunRecord) -> str:
    """The trial the ``*_vs_fp32`` columns divide by: ``fp32``, or the one fp32 trial a
    comparison across runs names (``run-id/fp32``, in its config's ``baseline``)."""
    named = record.config.get("baseline") if isinstance(record.config, dict) else None
    return named if isinstance(named, str) else BASELINE


def baseline_trial(record: RunRecord) -> TrialResult | None:
    """The fp32 trial when it finished ok and there is another trial to set against it,
    else None (a lone fp32 run compared with itself would read "1.00x", "0.0% saved")."""
    trial = record.trial(baseline_label(record))
    alone = all(t is trial for t in record.trials)
    return trial if trial is not None and trial.status == "ok" and not alone else None


def baseline_reason(record: RunRecord) -> str | None:
    """Why the ``*_vs_fp32`` columns are n/a, or None when there is a baseline."""
    trial = record.trial(baseline_label(record))
    why = record.config.get("baseline_reason") if isinstance(record.config, dict) else None
    if trial is None and isinstance(why, str):
        return why
    if trial is None:
        return "no fp32 trial in this run: add fp32 to the precisions to compare against it"
    if trial.status != "ok":
        why = f": {trial.reason}" if trial.reason else ""
        return f"the fp32 trial ended '{trial.status}'{why}, so there is no baseline"
    if all(t is trial for t in record.trials):
        return (f"{trial.precision} is this run's only trial: there is nothing to compare "
                "it against (the vs fp32 columns are n/a)")
    return None


def record_precisions(record: RunRecord) -> list[str]:
    """The order every view lists precisions in: finished trials as they ran, then live ones."""
    done = [t.precision for t in record.trials]
    return done + [p for p in record.live_steps if p not in done]


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def _row(trial: TrialResult, base: TrialResult | None, verdict: SpeedVerdict) -> ComparisonRow:
    s = trial.summary
    b = base.summary if base is not None else None
    sp = s.spread if s else None
    step_ms = s.median_step_ms if s else None
    peak = s.peak_memory_bytes if s else None
    final_loss = s.final_loss if s else None
    # an emulated format's step runs its GEMMs in higher precision: its ratio to fp32 would
    # read as the format's speed, which it is not
    emulated = trial.support == "emulated"
    speedup = _ratio(b.median_step_ms, step_ms) if b and not emulated else None
    speedup_ci = None  # none for fp32 itself: 1.0 by definition
    if b is not None and speedup is not None and trial is not base:
        speedup_ci = _ratio_ci(base, trial)
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
        step_ms_p10_p90=(sp.p10_step_ms, sp.p90_step_ms) if sp else None,
        step_ms_cv=sp.cv if sp else None,
        tokens_per_s=s.tokens_per_s if s else None,
        tokens_per_s_ci=sp.tokens_per_s_ci if sp else None,
        speedup_vs_fp32=speedup,
        speedup_ci=speedup_ci,
        speed_verdict=_row_verdict(trial, base, speedup_ci, verdict),
        mfu=s.mfu if s else None,
        mfu_measured=s.mfu_measured if s else None,
        hfu=s.hfu if s else None,
        peak_memory_bytes=peak,
        memory_saving_vs_fp32=None if peak_share is None else 1.0 - peak_share,
        skipped_steps=s.skipped_steps if s else None,
        final_loss_diff_vs_fp32=loss_diff,
        energy_per_token_vs_fp32=_ratio(s.energy_per_token_j if s else None,
                                        b.energy_per_token_j if b else None),
        lost_updates=lost_cell(trial) or None,
        compiled=trial.compiled,
        mfu_common=s.mfu_common if s else None,
    )


def trained_text(trial: TrialResult) -> str | None:
    """What the trial trained: int8 and nf4 train LoRA adapters on a frozen base."""
    if not trial.param_count:
        return None
    if trial.lora is None:
        return f"all weights ({trial.trainable_params:,})"
    return f"LoRA adapters only ({trial.trainable_params:,}, r={trial.lora['r']})"


def comparison_rows(record: RunRecord, verdict: SpeedVerdict | None = None
                    ) -> list[ComparisonRow]:
    """One row per finished trial, in the order the trials ran."""
    base = baseline_trial(record)
    verdict = verdict or speed_verdict(record.trials)
    return [_row(trial, base, verdict) for trial in record.trials]


# --- can the run rank the precisions? -------------------------------------------------

CV_LIMIT = 0.10  # pyperf's limit: a std above 10% of the mean marks a benchmark unstable
DRIFT_LIMIT = 0.10  # interleaved rounds of one precision whose medians differ more: drift
NOISY_RULE = (
    f"a run is noisy when a finished trial has fewer than {spread.MIN_STEPS} measured steps "
    f"or its step-time CV within a round is above {CV_LIMIT:.0%}; otherwise two precisions "
    f"are ranked only when the {spread.CI_LEVEL:.0%} bootstrap CI of the ratio of their "
    "median step times, widened by each one's drift between its interleaved rounds (the ends "
    "divided and multiplied by 1 + drift), excludes 1.0, and precisions whose CIs include 1.0 "
    f"count as tied (a drift above {DRIFT_LIMIT:.0%} is named); and "
    + CONTENTION_RULE
)
NOISY_TEXT = "noisy: speed-ups not significant"
EMULATED_TEXT = "emulated: not representative"
BUSY_TEXT = "not ranked: the machine was busy"


@dataclass(frozen=True)
class SpeedVerdict:
    """Whether the run's speeds can rank its precisions, and the ranking when they can.

    ``status``: "ranked" (at least two groups told apart), "tied" (spread fine, but no
    precision measurably faster than another), "noisy" (too few steps to bound a CI, steps too
    spread within a round, or the host too busy: ``engine.measure.contention``) or
    "n/a" (fewer than two finished trials). ``ranking`` is None unless "ranked": groups
    fastest first, precisions in one group statistically tied.
    """

    status: str
    text: str
    problems: tuple[str, ...] = ()
    ranking: tuple[tuple[str, ...], ...] | None = None
    suggestion: str | None = None
    # precisions whose speed was left out: they ran compiled where the baseline ran eagerly
    # (or the reverse), engine.record.like_with_like
    unmatched: tuple[str, ...] = ()

    @property
    def noisy(self) -> bool:
        return self.status == "noisy"


def _measured(trial: TrialResult) -> list[float]:
    return spread.measured_step_ms(trial.steps)


def _ratio_ci(a: TrialResult, b: TrialResult) -> tuple[float, float] | None:
    """The bootstrap CI of median(a) / median(b), widened by both trials' round drift."""
    return spread.widened(spread.ratio_ci(_measured(a), _measured(b)),
                          spread.round_drift(a.steps), spread.round_drift(b.steps))


def _tied(a: TrialResult, b: TrialResult) -> bool:
    ci = _ratio_ci(a, b)
    return ci is None or ci[0] <= 1.0 <= ci[1]


def _groups(trials: list[TrialResult]) -> list[list[TrialResult]]:
    """Fastest first; groups merged until every pair in different groups is significant."""
    ordered = sorted(trials, key=lambda t: t.summary.median_step_ms)
    ties = {(i, j): _tied(ordered[i], ordered[j])
            for i in range(len(ordered)) for j in range(i + 1, len(ordered))}
    group_of = list(range(len(ordered)))
    changed = True
    while changed:
        changed = False
        for i in range(len(ordered)):
            for j in range(i + 1, len(ordered)):
                if group_of[i] != group_of[j] and ties[i, j]:
                    # merge everything between them: a tie inside a chain ties the chain
                    low, high = group_of[i], group_of[j]
                    group_of = [low if low <= g <= high else g for g in group_of]
                    changed = True
    groups: dict[int, list[TrialResult]] = {}
    for g, trial in zip(group_of, ordered):
        groups.setdefault(g, []).append(trial)
    return list(groups.values())


def speed_verdict(trials: list[TrialResult], reference: str = BASELINE) -> SpeedVerdict:
    """Apply ``NOISY_RULE`` to the finished trials that ran the same way (compiled or eager)
    as the ``reference`` trial; the others are named in the text and in ``unmatched``."""
    kept, unmatched, note = like_with_like.split(trials, reference)
    verdict = _rank_speeds(kept)
    if not unmatched:
        return verdict
    return dataclasses.replace(verdict, text=verdict.text + note, unmatched=unmatched)


def _rank_speeds(trials: list[TrialResult]) -> SpeedVerdict:
    # an emulated trial's speed is not its format's hardware's (engine/measure/gating.py): unranked
    done = [t for t in trials if t.status == "ok" and t.summary is not None
            and t.summary.median_step_ms and t.support != "emulated"]
    if len(done) < 2:
        return SpeedVerdict("n/a", "fewer than two finished trials: nothing to rank")
    busy = contention_problems(done)
    if busy:  # a steady slowdown passes the spread checks below: never rank through it
        return SpeedVerdict("noisy", f"{BUSY_TEXT}: " + "; ".join(busy), tuple(busy), None,
                            "close other programs and runs (or wait for them to finish) "
                            "and profile again")
    few = [f"{t.precision} {len(_measured(t))}" for t in done
           if len(_measured(t)) < spread.MIN_STEPS]
    if few:
        problem = (f"too few measured steps for a spread (need {spread.MIN_STEPS}): "
                   + ", ".join(few))
        most = max(len(_measured(t)) for t in done)
        return SpeedVerdict("noisy", f"{NOISY_TEXT}: {problem}", (problem,), None,
                            f"run more steps (--steps {max(4 * spread.MIN_STEPS, 2 * most)})")
    # unsteady steps widen each median's bootstrap CI: recipes far apart stay ranked, close
    # ones tie (the issue #44 finding: one recipe's 17% CV silenced a 15x difference)
    unsteady = [f"{t.precision} step time varies {_round_cv(t):.0%} (CV above {CV_LIMIT:.0%})"
                for t in done if (_round_cv(t) or 0.0) > CV_LIMIT]
    drifted = [f"{t.precision}'s rounds differ by {d:.0%} in median step time" for t in done
               if (d := spread.round_drift(t.steps) or 0.0) > DRIFT_LIMIT]
    noted = (f" ({'; '.join(drifted)}: the CIs of their ratios are widened by that drift)"
             if drifted else "")
    noted += f" ({'; '.join(unsteady)}: wide CIs)" if unsteady else ""
    # narrower CIs would tell closer recipes apart
    steadier = "run on an idle machine with more steps" if drifted or unsteady else None
    groups = _groups(done)
    if len(groups) == 1:
        return SpeedVerdict(
            "tied", f"speed-ups not significant: the {spread.CI_LEVEL:.0%} CI of every ratio "
            f"of median step times includes 1.0, so no precision is measurably faster here"
            f"{noted}", (), None,
            steadier or "more steps narrow the CIs, if a difference this small matters")
    ranking = tuple(tuple(t.precision for t in g) for g in groups)
    text = " > ".join(" = ".join(g) for g in ranking)
    tied = any(len(g) > 1 for g in ranking)
    ties = f" ('=': tied within the {spread.CI_LEVEL:.0%} CIs)" if tied else ""
    return SpeedVerdict("ranked", f"ranked by speed, fastest first: {text}{ties}{noted}", (),
                        ranking, steadier)


def _round_cv(trial: TrialResult) -> float | None:
    """The largest step-time CV within one of the trial's rounds: drift between rounds
    widens the ratios' CIs instead (``spread.widened``), so it is not counted twice."""
    by_round: dict[int, list[float]] = {}
    for s in trial.steps:
        if not s.warmup and not s.skipped:
            by_round.setdefault(s.round, []).append(s.step_ms)
    cvs = [statistics.stdev(v) / statistics.fmean(v) for v in by_round.values()
           if len(v) > 1 and statistics.fmean(v) > 0]
    return max(cvs, default=None)


def _row_verdict(trial: TrialResult, base: TrialResult | None,
                 ci: tuple[float, float] | None, verdict: SpeedVerdict) -> str | None:
    if trial.status != "ok" or trial.summary is None:
        return None
    if trial.support == "emulated":  # with or without a baseline to compare with
        return EMULATED_TEXT
    if trial.precision in verdict.unmatched:
        return like_with_like.UNMATCHED_TEXT
    if base is None:
        return None
    if trial is base:
        return "baseline"
    if verdict.noisy:
        return "noisy: not significant"
    if ci is None:
        return None
    if ci[0] > 1.0:
        return "faster"
    if ci[1] < 1.0:
        return "slower"
    return "not significant"


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


def _range(fmt: Callable[[float], str], unit: str) -> Formatter:
    return lambda pair: f"{fmt(pair[0])}..{fmt(pair[1])}{unit}"


def _tokens_number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else _significant(value)


Formatter = Callable[[object], str]


def _signed(value: float, places: int) -> str:
    """"+0.0123", "-0.0123"; a difference that rounds to zero reads "0.0000", never "-0.0000"."""
    text = f"{value:+.{places}f}"
    return text[1:] if float(text) == 0 else text

COLUMNS: list[tuple[str, str, Formatter]] = [
    ("precision", "Precision", str),
    ("status", "Status", str),
    ("trained", "Trained params", str),
    ("median_step_ms", "Step time", lambda v: f"{_significant(v)} ms"),
    ("step_ms_p10_p90", "Step p10..p90", _range(_significant, " ms")),
    ("step_ms_cv", "Step CV", _percent),
    ("tokens_per_s", "Throughput", _tokens),
    ("tokens_per_s_ci", f"Throughput {spread.CI_LEVEL:.0%} CI", _range(_tokens_number, " tok/s")),
    ("speedup_vs_fp32", "Speed-up vs fp32", lambda v: f"{v:.2f}x"),
    ("speedup_ci", f"Speed-up {spread.CI_LEVEL:.0%} CI", _range(lambda v: f"{v:.2f}", "x")),
    ("speed_verdict", "Speed-up verdict", str),
    ("mfu_common", "MFU vs common 16-bit peak", _percent),
    ("mfu", "MFU (model FLOPs) vs datasheet peak", _percent),
    ("mfu_measured", "MFU (model FLOPs) vs measured matmul peak", _percent),
    ("hfu", "HFU (hardware FLOPs)", _percent),
    ("peak_memory_bytes", "Peak memory", format_bytes),
    ("memory_saving_vs_fp32", "Memory saved vs fp32", _percent),
    ("skipped_steps", "Skipped steps", lambda v: f"{v:d}"),
    ("final_loss_diff_vs_fp32", "Final loss vs fp32", lambda v: _signed(v, 4)),
    ("energy_per_token_vs_fp32", "Energy/token vs fp32", lambda v: f"{v:.2f}x"),
    ("lost_updates", "Lost updates (min lr)", str),
    ("compiled", "Compiled", lambda v: "yes" if v else "no"),
    ("reason", "Reason", str),
]
"""(row field, header, formatter of a non-None value), in display order."""

_FORMATTERS = {key: fmt for key, _, fmt in COLUMNS}
_TEXT_KEYS = {"precision", "status", "trained", "reason", "speed_verdict", "lost_updates"}


def format_cell(key: str, value) -> str:
    """Text for one cell: "n/a" for a missing number, "" for a missing reason."""
    if value is None:
        return "" if key in _TEXT_KEYS else "n/a"
    return _FORMATTERS[key](value)


def _speedup_with_ci(row: ComparisonRow) -> str:
    if row.speedup_vs_fp32 is None:
        return "n/a"
    text = format_cell("speedup_vs_fp32", row.speedup_vs_fp32)
    if row.speedup_ci is None:
        return text
    return f"{text} [{row.speedup_ci[0]:.2f}..{row.speedup_ci[1]:.2f}]"


# the terminal table: what decides between precisions; the rest is under --wide
_NARROW: list[tuple[str, Callable[[ComparisonRow], str]]] = [
    ("Precision", lambda r: r.precision),
    ("Status", lambda r: r.status),
    ("Step time", lambda r: format_cell("median_step_ms", r.median_step_ms)),
    (f"Speed-up [{spread.CI_LEVEL:.0%} CI]", _speedup_with_ci),
    # "emulated: not representative" would push the table past 120 columns: said below it
    ("Verdict", lambda r: "emulated" if r.speed_verdict == EMULATED_TEXT
     else format_cell("speed_verdict", r.speed_verdict)),
    ("Peak mem", lambda r: format_cell("peak_memory_bytes", r.peak_memory_bytes)),
    ("Mem saved", lambda r: format_cell("memory_saving_vs_fp32", r.memory_saving_vs_fp32)),
    ("Skips", lambda r: format_cell("skipped_steps", r.skipped_steps)),
    ("Loss diff", lambda r: format_cell("final_loss_diff_vs_fp32", r.final_loss_diff_vs_fp32)),
]
_NARROW_TEXT = {"Precision", "Status", "Verdict"}
TABLE_WIDTH = 120  # a terminal the table fits by default


def _aligned(headers: list[str], cells: list[list[str]], text: set[int]) -> list[str]:
    """Text columns left-aligned, numbers right-aligned, two spaces apart."""
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    def line(values: list[str]) -> str:
        return "  ".join(v.ljust(w) if i in text else v.rjust(w)
                         for i, (v, w) in enumerate(zip(values, widths))).rstrip()

    return [line(headers), "  ".join("-" * w for w in widths), *(line(r) for r in cells)]


def _compiled_lines(rows: list[ComparisonRow]) -> list[str]:
    """Which trials' timed steps ran under torch.compile (a column would not fit 120)."""
    said = [row for row in rows if row.compiled is not None]
    if not any(row.compiled for row in said):
        return []
    compiled = ", ".join(row.precision for row in said if row.compiled)
    eager = ", ".join(row.precision for row in said if not row.compiled)
    text = f"compiled (torch.compile): {compiled}" + (f"; eager: {eager}" if eager else "")
    return textwrap.wrap(text, TABLE_WIDTH, initial_indent="  ", subsequent_indent="    ")


def format_table(rows: list[ComparisonRow], wide: bool = False) -> str:
    """A plain aligned text table. By default it fits 120 columns: speed, memory and loss
    per precision, with what each trained and why it did not run wrapped below;
    ``wide`` gives every column of ``COLUMNS``."""
    if wide:
        headers = [header for _, header, _ in COLUMNS]
        cells = [[format_cell(key, getattr(row, key)) for key, _, _ in COLUMNS]
                 for row in rows]
        text = {i for i, (key, _, _) in enumerate(COLUMNS) if key in _TEXT_KEYS}
        return "\n".join(_aligned(headers, cells, text))
    headers = [header for header, _ in _NARROW]
    cells = [[cell(row) for _, cell in _NARROW] for row in rows]
    lines = _aligned(headers, cells, {i for i, h in enumerate(headers) if h in _NARROW_TEXT})
    for row in rows:
        if row.trained and row.trained.startswith("LoRA"):
            lines.append(f"  {row.precision} trained {row.trained}")
        if row.reason:
            lines += textwrap.wrap(f"{row.precision}: {row.reason}", TABLE_WIDTH,
                                   initial_indent="  ", subsequent_indent="    ")
    lines += _compiled_lines(rows)
    emulated = [row.precision for row in rows if row.speed_verdict == EMULATED_TEXT]
    if emulated:
        lines += textwrap.wrap(f"{EMULATED_TEXT}: {', '.join(emulated)} ran without their "
                               "format's own hardware (their GEMMs run in higher precision): "
                               "speed-up n/a, their speed is left out of the ranking",
                               TABLE_WIDTH, initial_indent="  ", subsequent_indent="    ")
    lines.append("  (speed-up, memory saved and loss diff are vs fp32; --wide adds step "
                 "p10..p90 and CV, tokens/s, MFU, HFU, energy)")
    return "\n".join(lines)
