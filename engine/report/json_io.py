"""The JSON report: the whole run record, readable back into the same objects
(``engine.record.json_report.read_json``, below the exports so the journal's reader can
open a report too).

Losses that overflowed are written as the bare tokens ``NaN`` / ``Infinity``, as
Python's json module does: they are measurements (the run diverged), not missing
values, so they are kept rather than turned into null. Anywhere else a non-finite number
is a failed reading and is written as null, with a line in the report's log
(engine.record.nonfinite). See docs/report-schema.md.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from engine.core.atomic import atomic_write
from engine.record import nonfinite
from engine.record.run_record import RunRecord


def comparison_dict(record: RunRecord) -> dict:
    """The verdict, the comparison table and the speed verdict as written for readers of
    the JSON file.

    Derived from the trials (readers of the report recompute it and ignore this key)."""
    from engine.record import spread
    from engine.record.compare import NOISY_RULE, comparison_rows, speed_verdict
    from engine.record.verdict import verdict as recommend

    verdict = speed_verdict(record.trials)
    return {
        "verdict": dataclasses.asdict(recommend(record)),
        "rows": [dataclasses.asdict(r) for r in comparison_rows(record, verdict)],
        "speed_verdict": dataclasses.asdict(verdict),
        "spread_method": spread.METHOD,
        "noisy_rule": NOISY_RULE,
    }


def write_json(record: RunRecord, path: str | os.PathLike) -> Path:
    data = record.to_dict()
    data["comparison"] = comparison_dict(record)
    from engine.run.fp8_layers import report_payoff

    data["payoff"] = report_payoff(record)  # would fp8 pay here (derived, like comparison)
    return atomic_write(path, lambda fh: nonfinite.dump_json(data, fh, "this report",
                                                             indent=1))
