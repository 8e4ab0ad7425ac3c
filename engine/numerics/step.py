"""One forward pass under a precision recipe, shared by the gradient and op-trace probes."""

from __future__ import annotations

import torch
from torch import nn

from engine.core.recipes import Recipe, autocast_for


def forward_loss(model: nn.Module, batch: dict, recipe: Recipe,
                 device: torch.device) -> torch.Tensor:
    """The model's loss on ``batch`` under the recipe's autocast (backward stays outside)."""
    with autocast_for(recipe, device):
        out = model(**batch)
    loss = getattr(out, "loss", None)
    if loss is None:
        raise ValueError("the model returned no loss: the batch needs a 'labels' entry")
    return loss
