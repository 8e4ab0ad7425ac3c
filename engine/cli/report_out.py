"""``--out``: a report file checked before a command runs and written after it
(``profile``, ``numerics``, ``report``)."""

from __future__ import annotations

from pathlib import Path

from engine.cli.output import say


def check_out(out: str):
    from engine.report.writer import check_writable

    return check_writable(out)


def write_report(record, out, note: str = "") -> bool:
    """Write ``record`` to ``out``; on failure say why in one line (with ``note``)."""
    from engine.report.writer import write_report as write

    try:
        write(record, out)
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        say(f"ampscope: error: could not write the report {out} ({why})"
            + (f"; {note}" if note else ""), err=True)
        return False
    return True


def written(out) -> str:
    """Where a report went: a CSV report is two files, the steps and the comparison."""
    if Path(out).suffix.lower() != ".csv":
        return str(out)
    from engine.report.csv_io import comparison_path

    return f"{out} (steps) and {comparison_path(out)} (comparison table)"
