"""Texts cut to what the journal's reader accepts (engine/record/validate.py's limits), so
every run written reads back: a user's run name, an exception's message or its traceback can be
any length."""

from __future__ import annotations

import traceback

from engine.record.validate import MAX_NAME, MAX_TEXT

__all__ = ["MAX_NAME", "MAX_TEXT", "cut", "traceback_text"]


def cut(text: str, limit: int) -> str:
    """``text``, or its start and a note saying how long it was, in ``limit`` characters."""
    if len(text) <= limit:
        return text
    note = f" [... cut: {len(text):,} characters, the first {{kept:,}} kept]"
    kept = limit - len(note.format(kept=limit))
    return text[:kept] + note.format(kept=kept)


def traceback_text(exc: BaseException) -> str:
    """``exc``'s traceback as Python prints it (chained exceptions included). One longer than
    the reader accepts keeps its start and its end, where it raised, cut in the middle."""
    text = "".join(traceback.format_exception(exc))
    if len(text) <= MAX_TEXT:
        return text
    note = f"\n[... cut: {len(text):,} characters, the middle left out ...]\n"
    half = (MAX_TEXT - len(note)) // 2
    return text[:half] + note + text[-half:]
