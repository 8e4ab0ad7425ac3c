"""``clip_grad_norm_``'s pre-clipping norm, kept for the Recorder (nanoGPT's train.py
computes it and drops it).

Where torch's ``clip_grad_norm_`` hands its norm to the module's ``_clip_grads_with_norm_``
(looked up in its module at each call), that is where it is kept: a ``clip_grad_norm_``
imported by name before the Recorder started is seen too. Otherwise the public name is
wrapped (a name bound earlier is then not seen, and the norm AmpScope measures is the
clipped one).
"""

from __future__ import annotations

import inspect

import torch


class ClipNormKeeper:
    """Calls ``kept(norm)`` with each clipping's total norm over ``model``'s parameters
    until ``remove()``."""

    def __init__(self, model: torch.nn.Module, kept) -> None:
        module = torch.nn.utils.clip_grad
        mine = {id(p) for p in model.parameters()}
        body = inspect.unwrap(getattr(module, "clip_grad_norm_", None))
        inner = getattr(module, "_clip_grads_with_norm_", None)
        if inner is not None and "_clip_grads_with_norm_" in getattr(
                getattr(body, "__code__", None), "co_names", ()):

            def _clip_grads_with_norm_(parameters, max_norm, total_norm, *args, **kwargs):
                if isinstance(parameters, torch.Tensor):
                    parameters = [parameters]
                parameters = list(parameters)
                if any(id(p) in mine for p in parameters):
                    kept(total_norm.detach())
                return inner(parameters, max_norm, total_norm, *args, **kwargs)

            module._clip_grads_with_norm_ = _clip_grads_with_norm_
            self._patch = (module, "_clip_grads_with_norm_", inner, _clip_grads_with_norm_)
            return
        real = torch.nn.utils.clip_grad_norm_

        def clip_grad_norm_(parameters, *args, **kwargs):
            if isinstance(parameters, torch.Tensor):
                parameters = [parameters]
            parameters = list(parameters)
            norm = real(parameters, *args, **kwargs)
            if any(id(p) in mine for p in parameters):
                kept(norm.detach())
            return norm

        torch.nn.utils.clip_grad_norm_ = clip_grad_norm_
        self._patch = (torch.nn.utils, "clip_grad_norm_", real, clip_grad_norm_)

    def remove(self) -> None:
        if self._patch is not None:
            module, name, real, ours = self._patch
            if getattr(module, name) is ours:  # a later patch stays
                setattr(module, name, real)
            self._patch = None
