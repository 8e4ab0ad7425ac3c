"""AmpScope's public API for your own training scripts (the only module meant to be imported).

- ``Recorder(model, optimizer=None, scaler=None, out=None, name=None)``: a hand-written
  loop (``rec.step()`` per optimiser step, ``rec.log(name=value)`` for other scalars).
- ``AmpScopeCallback(out=None, name=None)``: a ``transformers.TrainerCallback``.

Both write the run journal as they go and a report at the end. ``engine`` and ``gui``
are internal. The names load on first use, so ``import ampscope`` is cheap.
"""

from __future__ import annotations

from engine import VERSION as __version__

__all__ = ["AmpScopeCallback", "Recorder", "__version__"]


def __getattr__(name: str):
    if name == "Recorder":
        from ampscope.recorder import Recorder

        return Recorder
    if name == "AmpScopeCallback":
        from ampscope.callback import AmpScopeCallback

        return AmpScopeCallback
    raise AttributeError(f"module 'ampscope' has no attribute {name!r}")
