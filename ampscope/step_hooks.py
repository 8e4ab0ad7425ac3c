"""The Recorder's hooks on the user's model and optimizer: where a step's time goes and
what its training forwards carry.

A forward pre-hook and hook mark the forward (a training forward) or an evaluation
(``model.eval()`` or ``no_grad``), read the step's tokens (the attention mask's sum on the
device, else the input ids' size) and sequence length; the loss's gradient hook marks the
backward's start; an optimizer step pre-hook marks the optimizer and takes the lr each
group used and, where the loop gives none, the gradients' norm (on the device, read one
step late). ``block``/``late_block`` time a Trainer's evaluation or save as a whole. The
marks are split into phases by ampscope/phases.py. A mixin of
``ampscope.recorder.Recorder``, whose constructor makes the state it reads.
"""

from __future__ import annotations

import functools
import time
from contextlib import contextmanager

import torch

from ampscope import what_ran
from ampscope.never_raises import never_raises
from ampscope.phases import loss_of


class StepHooks:
    """The model's and optimizer's hooks of a Recorder (see the module's docstring)."""

    def _before_optimizer_step(self, optimizer, args, kwargs):
        """The lr this optimizer step uses (a scheduler changes it after the step), and the
        gradients' norm when the loop gives none: device tensors, read one step late."""
        self._phases.append(("optimizer", self._now()))
        self._watch_phase("optimizer")
        # every parameter group's lr (group 0's is the step's learning_rate)
        self._step_lr = [lr.detach().clone() if isinstance(lr, torch.Tensor) else lr
                         for lr in (g.get("lr") for g in optimizer.param_groups)] or None
        if self._measure_norm and self._step_norm is None:
            grads = [p.grad for group in optimizer.param_groups for p in group["params"]
                     if p.grad is not None]
            if grads:
                self._step_norm = (torch.nn.utils.get_total_norm(grads).detach(), "measured")
        return None

    def _clip_norm(self, norm) -> None:
        """clip_grad_norm_'s pre-clipping norm of this step (ampscope/clip_norm.py)."""
        if self._measure_norm:
            self._step_norm = (norm, "clip")

    def _unpatch_clip(self) -> None:
        if self._clip_patch is not None:
            self._clip_patch.remove()
            self._clip_patch = None

    def _now(self):
        """A time mark: a CUDA event on a GPU (recorded, never waited on now)."""
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return event
        return time.perf_counter()

    def _mark(self, kind: str) -> None:
        """A time mark of this step (see ampscope/phases.py); a repeated backward_end (one
        per parameter in the first step) moves the last one."""
        if kind == "backward_end" and self._phases and self._phases[-1][0] == kind:
            self._phases[-1] = (kind, self._now())
        else:
            self._phases.append((kind, self._now()))

    def _backward_began(self, grad) -> None:
        self._mark("backward")

    @contextmanager
    def block(self, kind: str):
        """A block of the step the caller knows the kind of ("eval", "save": the Trainer's
        evaluation and checkpoint saves), timed as that phase as a whole; forwards inside
        it mark nothing more."""
        self._phases.append((kind, self._now()))
        self._in_block = True
        try:
            yield
        finally:
            self._in_block = False
            self._phases.append((f"{kind}_end", self._now()))

    @contextmanager
    def late_block(self, kind: str):
        """A block after the last recorded step ended (the Trainer's evaluation or save at
        an epoch's end, after its last step): added to that step, whose time now runs to
        the block's end; none when that step was already written."""
        last = self._pending[-1] if self._pending and self._index == self._pending[-1].index + 1 \
            else None
        if last is None:
            yield
            return
        last.phases.append((kind, self._now()))
        try:
            yield
        finally:
            last.mark.end = self._now()
            last.phases.append((f"{kind}_end", last.mark.end))

    @never_raises
    def _after_forward(self, module, args, output):
        if self._in_eval:
            self._in_eval = False
            if not self._in_block:
                self._phases.append(("eval_end", self._now()))
        if self._in_forward:
            self._in_forward = False
            self._phases.append(("forward_end", self._now()))
            self._watch_phase("backward")
            loss = loss_of(output)
            if loss is not None:  # its gradient is a backward's first: the backward begins
                loss.register_hook(self._backward_began)
        mark, self._eval_mark = self._eval_mark, None
        if mark is not None and self._counter is not None:
            # an evaluation forward inside the counting step: its FLOPs are not training's
            ops, dtypes = self._tallies()
            self._excluded[0].update(ops - mark[0])
            self._excluded[1].update(dtypes - mark[1])
        return None

    @never_raises
    def _on_forward(self, module, args, kwargs):
        if not (module.training and torch.is_grad_enabled()):
            # evaluation (model.eval() or no_grad) is neither a training step's tokens nor
            # its FLOPs
            if self._counter is not None:
                self._eval_mark = self._tallies()
            if self._in_block:
                pass  # inside a block timed as a whole
            elif self._phases and self._phases[-1][0] == "eval_end":
                self._phases.pop()  # the evaluation goes on: between its forwards too
            else:
                self._phases.append(("eval", self._now()))
            self._in_eval = True
            return None
        self._in_forward = True
        self._phases.append(("forward", self._now()))
        self._watch_phase("forward")
        if self._autocast_probe is None:  # autocast as the first training forward runs it
            self._autocast_probe = what_ran.AutocastProbe(
                self.model, self.device.type, functools.partial(setattr, self, "_autocast"))
        mask = kwargs.get("attention_mask")
        ids = kwargs.get("input_ids")
        if ids is None and args and isinstance(args[0], torch.Tensor):
            ids = args[0]
        if isinstance(mask, torch.Tensor):
            self._forward_tokens.append(mask.sum())  # a device tensor: read later, no sync
            self._seq_len = int(mask.shape[-1])
        elif isinstance(ids, torch.Tensor):
            self._forward_tokens.append(int(ids.numel()))
            self._seq_len = int(ids.shape[-1])
        return None
