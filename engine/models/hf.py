"""transformers' AutoConfig, imported by one thread at a time, and the model class of a task.

The window loads transformers in its device-probe thread while a run may start in
another; two threads importing transformers' lazy module at once can see it half
initialised ("cannot import name 'AutoConfig' from 'transformers'").
"""

from __future__ import annotations

import threading

_IMPORT_LOCK = threading.Lock()


def load_transformers() -> None:
    """Import transformers with the modelling code every model family shares (the bulk of
    what checking or building a model imports: torch-side utilities, accelerate)."""
    auto_config()
    with _IMPORT_LOCK:
        import transformers.modeling_utils  # noqa: F401


def auto_config():
    """``transformers.AutoConfig``, once its import has finished in whichever thread began it."""
    with _IMPORT_LOCK:
        from transformers import AutoConfig
    return AutoConfig


def model_class(task: str):
    """The transformers Auto class that builds a task's training head (presets size their
    models with it, so it lives below both the presets and the model loader)."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

    return {"masked-lm": AutoModelForMaskedLM, "seq2seq-lm": AutoModelForSeq2SeqLM}.get(
        task, AutoModelForCausalLM)
