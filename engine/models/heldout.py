"""The loss on held-out batches: tokens no step trained on, the same for every precision.

A trial's training batches cycle through a small pool, so its final training loss is
partly memorised; the verdict compares each precision's held-out loss drop with fp32's.
"""

from __future__ import annotations

import torch

from engine.core.config import DATA_RANDOM
from engine.core.events import HeldOutLoss
from engine.core.recipes import Recipe, autocast_for
from engine.models import training_data

BATCHES = 2
SEED_OFFSET = 1_000_003  # a seed the training pool (config.seed) never draws from
_EVALUATED = ("forward only under the recipe's autocast, in eval mode; before the first step "
              "and after the trial's last")


def method(data: str) -> str:
    """How the held-out loss of a run on ``data`` (``RunConfig.data``) is measured."""
    where = (f"seed + {SEED_OFFSET}: random tokens no step trained on" if data == DATA_RANDOM
             else "windows from the held-out end of the token stream, where no training "
                  "window lies")
    return f"mean loss over {BATCHES} held-out batches ({where}), {_EVALUATED}"


def batches(loaded, config, device: torch.device) -> list[dict]:
    return training_data.heldout_batches(loaded, config, BATCHES, config.seed + SEED_OFFSET,
                                         device)


def loss(model, rec: Recipe, held: list[dict], device: torch.device) -> float:
    """The mean loss over ``held`` (one host read, untimed)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), autocast_for(rec, device):
            total = sum(model(**b).loss.float() for b in held)
    finally:
        model.train(was_training)
    return float(total) / len(held)


def result(before: float, after: float, held: list[dict], steps: int, data: str) -> HeldOutLoss:
    tokens = sum(int(b["input_ids"].numel()) for b in held)
    return HeldOutLoss(method(data), len(held), tokens, before, after, steps)
