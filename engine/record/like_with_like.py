"""Speeds are compared only between trials that ran the same way: compiled or eager.

float8 compiles by default (it is fast only compiled) while the other recipes run eagerly
unless ``--compile``: a compiled fp8 step set against an eager bf16-amp one measures
torch.compile as much as fp8. The trials that ran otherwise than the reference (fp32, else
most trials) are left out of the speed ranking, and the speed verdict says which; the
verdict compares their memory only with trials that ran as they did (torch.compile's fused
kernels hold less than eager ones: a compiled peak beside an eager one measures the compiler).
"""

from __future__ import annotations

from collections import Counter

from engine.core.config import recipe_name
from engine.core.events import TrialResult

BASELINE = "fp32"
UNMATCHED_TEXT = "not like with like"


def ran_compiled(trial: TrialResult) -> bool | None:
    """Whether the trial's steps ran under torch.compile (None: not known): its ``compiled``
    field; in older reports, which lack it, the recipe text, which says "compiled with
    torch.compile" for a compiled non-float8 trial and "ran eagerly" for an eager float8 one
    (engine.core.recipes.run_description): float8 compiles by default."""
    if trial.compiled is not None:
        return trial.compiled
    text = trial.recipe or ""
    if trial.status != "ok" or not text:
        return None
    if "compiled with torch.compile" in text:
        return True
    if "ran eagerly" in text:
        return False
    return recipe_name(trial.precision).startswith("fp8")


def _mode(compiled: bool) -> str:
    return "compiled" if compiled else "eager"


def split(trials: list[TrialResult], baseline: str = BASELINE
          ) -> tuple[list[TrialResult], tuple[str, ...], str]:
    """(the trials whose speeds are compared, the precisions left out, a sentence saying
    which and why; "" when all ran alike). ``baseline``: the trial the others are set
    against (fp32, or the verdict's reference in a run without one)."""
    modes = {t.precision: ran_compiled(t) for t in trials}
    known = [m for m in modes.values() if m is not None]
    if len(set(known)) < 2:
        return list(trials), (), ""
    reference = modes.get(baseline)
    if reference is None:
        reference = Counter(known).most_common(1)[0][0]
    out = tuple(p for p, m in modes.items() if m is not None and m != reference)
    kept = [t for t in trials if t.precision not in out]
    other = _mode(not reference)
    return kept, out, (
        f"; {', '.join(out)} ran {other} while "
        f"{baseline if baseline in modes else 'the others'} ran {_mode(reference)}: "
        f"{UNMATCHED_TEXT}, so {'its speed is' if len(out) == 1 else 'their speeds are'} left "
        f"out of the ranking (profile with --compile to compare every precision compiled)")
