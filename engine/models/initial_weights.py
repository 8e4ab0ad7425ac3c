"""The run's initial weights: drawn once, seeded, in fp32, and loaded by every trial.

A preset (or a folder with a config and no weights) has no checkpoint, so each trial
used to draw its own random init in its own dtype: the same seed gave fp16 and bf16
trials different weights from fp32's, and drawing them in half precision on the CPU
is 4-5x slower than in fp32. The runner now draws them once per run, before the first
trial needs them, and writes them with ``save_pretrained`` (``config.json`` and
``model.safetensors``) to the run's folder; each trial loads that checkpoint through
transformers' ``from_pretrained`` and casts it to its recipe's dtype, so every recipe
starts from the same fp32 values by construction. The folder is removed when the run ends.
"""

from __future__ import annotations

import shutil
from pathlib import Path


def needed(model: str) -> bool:
    """Whether ``model`` has no checkpoint of its own, so the run draws one."""
    from engine.models.load import resolve_source

    try:
        return not resolve_source(model).has_weights
    except ValueError:  # bad input: the trial reports it
        return False


def too_big(params: int | None, folder: Path) -> str | None:
    """Why an fp32 copy of ``params`` parameters should not be drawn here (half the host's
    available memory, or of the folder's free disk, is the limit), or None. The parent
    process draws it: running out of memory there would end the run, not one trial."""
    import psutil

    if params is None:
        return "the model's parameter count is not known"
    need = 4 * params
    memory = psutil.virtual_memory().available
    disk = shutil.disk_usage(folder).free
    if need > memory / 2 or need > disk / 2:
        return (f"its fp32 weights ({need / 2**30:.1f} GiB) exceed half the available host "
                f"memory ({memory / 2**30:.1f} GiB) or free disk ({disk / 2**30:.1f} GiB)")
    return None


def write(model: str, seed: int, trust_remote_code: bool, folder: Path) -> Path:
    """Draw ``model``'s seeded initial weights in fp32 on the CPU and save them in
    ``folder``, which is returned."""
    import torch

    from engine.models.load import load_config, random_init, resolve_source

    config, task = load_config(resolve_source(model), trust_remote_code)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    net = random_init(config, task, torch.float32, torch.device("cpu"), seed, trust_remote_code)
    folder.mkdir(parents=True, exist_ok=True)
    net.save_pretrained(folder, safe_serialization=True)
    return folder


def remove(folder: Path | None) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
