"""A terminal table whose rows are either full (one value per header) or a precision with one
sentence (why it has no values), wrapped to the terminal's width."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence


def table_lines(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]],
                width: int) -> list[str]:
    """The title, the header and each row: the first column left-aligned, the others right;
    a two-cell row's sentence wraps under its own indent."""
    full = [r for r in rows if len(r) == len(headers)]
    widths = [max(len(r[i]) for r in (headers, *full)) for i in range(len(headers))]
    widths[0] = max(widths[0], *(len(r[0]) for r in rows))
    lines = textwrap.wrap(title, width)
    for r in (headers, *rows):
        if len(r) == len(headers):
            lines.append("  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                                   for i, (v, w) in enumerate(zip(r, widths))).rstrip())
        else:
            lines += textwrap.wrap(r[1], width, initial_indent=r[0].ljust(widths[0] + 2),
                                   subsequent_indent=" " * (widths[0] + 4))
    return lines
