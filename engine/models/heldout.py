"""The loss on held-out batches: tokens no step trained on, the same for every precision.

A trial's training batches cycle through a small pool, so its final training loss is
partly memorised; the verdict compares each precision's held-out loss drop with fp32's.
"""

from __future__ import annotations

import torch

from engine.core.events import HeldOutLoss
from engine.core.recipes import Recipe, autocast_for
from engine.models.load import make_batches

BATCHES = 2
SEED_OFFSET = 1_000_003  # a seed the training pool (config.seed) never draws from
METHOD = (f"mean loss over {BATCHES} held-out batches (seed + {SEED_OFFSET}: tokens no step "
          "trained on), forward only under the recipe's autocast, in eval mode; before the "
          "first step and after the trial's last")


def batches(model_config, task: str, config, device: torch.device) -> list[dict]:
    return make_batches(model_config, task, config.batch_size, config.seq_len, BATCHES,
                        config.seed + SEED_OFFSET, device)


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


def result(before: float, after: float, held: list[dict], steps: int) -> HeldOutLoss:
    tokens = sum(int(b["input_ids"].numel()) for b in held)
    return HeldOutLoss(METHOD, len(held), tokens, before, after, steps)
