"""Why a trial has no profiled step, in words a user can act on.

Reports written by an older AmpScope carry the engine's raw failure, e.g. "the profiled step
failed: AttributeError: 'FunctionEvent' object has no attribute 'linked_correlation_id'"
(every H200 report of 2026-11-27: that AmpScope read a profiler field torch 2.11 no longer
has). The Kernels tab says what happened and what to do; the raw text stays in a tooltip.
"""

from __future__ import annotations

import re

# the engine's wording (engine/run/trial_untimed.py) of a profiled step that raised
_FAILED = re.compile(r"the profiled step failed: [A-Za-z_.]+(Error|Exception|Warning)\b")


def in_words(reason: str | None, record) -> tuple[str, str]:
    """(the sentence shown, the details for its tooltip: the raw reason, or "")."""
    reason = reason or "not profiled"
    if not _FAILED.match(reason):
        return reason, ""
    environment = getattr(record, "environment", None) or {}
    version = environment.get("ampscope") or "an older version"
    torch = (environment.get("libraries") or {}).get("torch")
    on = f" on torch {torch}" if torch else ""
    return (f"the kernel table was not recorded: the profiler failed in the AmpScope "
            f"({version}){on} that wrote this report. Re-run the trial with a current "
            "AmpScope to get it.", f"Details: {reason}")
