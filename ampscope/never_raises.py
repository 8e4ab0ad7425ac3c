"""The Recorder's promise to the user's loop: after its construction, a failure of its own
never breaks the training."""

from __future__ import annotations

import functools


def never_raises(method):
    """After construction AmpScope never breaks the user's loop: a failure of its own is
    warned about once and the loop goes on; the journal keeps what was recorded."""

    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            if method.__name__ in ("step", "end_step"):
                self._failed_steps += 1
            self._warn_once("internal", f"recording failed in {method.__name__}() "
                            f"({type(exc).__name__}: {exc}); your training goes on and the "
                            f"journal {self.journal_file} keeps what was recorded")
            return None

    return guarded
