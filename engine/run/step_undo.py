"""Put back what a failed attempt at a training step changed, so that running the step again
equals a clean step (the first warm-up step, run again after its FLOP count failed).

An attempt can fail in the forward or backward (a quantised kernel refusing FlopCounterMode)
or after ``scaler.unscale_`` (the scaler then refuses a second unscale): gradients, the
scaler's stage and scale and the random state are put back. Once the optimizer step has
begun, weights and optimizer state may be partly updated: that is not undone (it would
need a copy of the weights in every counted step) and ``began_update`` says so.
"""

from __future__ import annotations

import torch


class StepUndo:
    """Notes what a step may change before it runs; ``restore`` puts it back."""

    def __init__(self, optimizer: torch.optim.Optimizer, scaler, device: torch.device):
        self.optimizer, self.scaler = optimizer, scaler
        self.rng = torch.get_rng_state()  # dropout's masks: the rerun draws the same ones
        self.device_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        self.device = device
        # GradScaler creates its scale on the first scale(): None then, as a clean step finds
        self.scale = [None if t is None else t.clone()
                      for t in (scaler._scale, scaler._growth_tracker)] if scaler else None
        self.began_update = False
        self._hook = optimizer.register_step_pre_hook(self._note)

    def _note(self, optimizer, args, kwargs) -> None:
        self.began_update = True

    def close(self) -> None:
        """Stop watching for the optimizer step (the attempt ended, either way)."""
        self._hook.remove()

    def restore(self) -> None:
        """Put back the gradients, scaler and random state (see ``began_update``)."""
        self.close()
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler:
            scale, tracker = self.scale
            if scale is None:
                self.scaler._scale = self.scaler._growth_tracker = None
            else:
                self.scaler._scale.copy_(scale)
                self.scaler._growth_tracker.copy_(tracker)
            # its unscaled / stepped stage: update() resets it, which the attempt never reached
            self.scaler._per_optimizer_states.pop(id(self.optimizer), None)
        torch.set_rng_state(self.rng)
        if self.device_rng is not None:
            torch.cuda.set_rng_state(self.device_rng, self.device)
