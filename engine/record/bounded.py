"""Texts cut to what the journal's reader accepts (engine/record/validate.py's limits), so
every run written reads back: a user's run name or exception message can be any length."""

from __future__ import annotations

from engine.record.validate import MAX_NAME, MAX_TEXT

__all__ = ["MAX_NAME", "MAX_TEXT", "cut"]


def cut(text: str, limit: int) -> str:
    """``text``, or its start and a note saying how long it was, in ``limit`` characters."""
    if len(text) <= limit:
        return text
    note = f" [... cut: {len(text):,} characters, the first {{kept:,}} kept]"
    kept = limit - len(note.format(kept=limit))
    return text[:kept] + note.format(kept=kept)
