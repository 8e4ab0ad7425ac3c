"""Put back what a failed attempt at a training step changed, so that running the step again
equals a clean step (the first warm-up step, run again after its FLOP count failed).

An attempt can fail anywhere: in the forward (a quantised kernel refusing FlopCounterMode),
after ``scaler.unscale_`` (the scaler then refuses a second unscale), or inside or after the
optimizer step (weights and optimizer state partly updated).
"""

from __future__ import annotations

import copy

import torch


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """A host copy of ``t`` as it is when the stream reaches this point; from a GPU into
    pinned memory without waiting (no host sync inside the step)."""
    if not t.is_cuda:
        return t.detach().clone()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return host.copy_(t.detach(), non_blocking=True)


class StepUndo:
    """Notes what a step may change before it runs; ``restore`` puts it back.

    The weights and the optimizer's state are copied only once the optimizer step starts
    (a failure before it leaves them untouched), and to the host: a device copy would add
    the trained weights' size to the step's peak on a GPU that may be nearly full. A restore
    waits for those copies (it copies them back on the same stream).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, scaler, device: torch.device):
        self.optimizer, self.scaler = optimizer, scaler
        self.rng = torch.get_rng_state()  # dropout's masks: the rerun draws the same ones
        self.device_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        self.device = device
        # GradScaler creates its scale on the first scale(): None then, as a clean step finds
        self.scale = [None if t is None else t.clone()
                      for t in (scaler._scale, scaler._growth_tracker)] if scaler else None
        self.weights: list[torch.Tensor] | None = None
        self.state: dict | None = None
        self._hook = optimizer.register_step_pre_hook(self._note)

    def _note(self, optimizer, args, kwargs) -> None:
        self.weights = [_to_host(p) for p in self._params()]
        # per parameter: its tensors on the host with their devices, then everything else
        self.state = {p: ({k: (_to_host(v), v.device)
                           for k, v in s.items() if torch.is_tensor(v)},
                          {k: copy.deepcopy(v) for k, v in s.items() if not torch.is_tensor(v)})
                      for p, s in optimizer.state.items()}

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def close(self) -> None:
        """Stop watching for the optimizer step (the attempt ended, either way)."""
        self._hook.remove()

    def restore(self) -> None:
        """Put back the gradients, weights, optimizer state, scaler and random state."""
        self.close()
        self.optimizer.zero_grad(set_to_none=True)
        if self.weights is not None:
            with torch.no_grad():
                for p, saved in zip(self._params(), self.weights):
                    p.copy_(saved)
            self.optimizer.state.clear()
            for p, (tensors, others) in self.state.items():
                self.optimizer.state[p] = {**{k: t.to(d) for k, (t, d) in tensors.items()},
                                           **others}
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
