"""Where a recorded step's time went: its time marks split into data, forward, backward,
optimizer, evaluation and save milliseconds that add up to the step.

The marks a step collects, in order (``Recorder._phases``): ``forward`` / ``forward_end``
(the model's training forward), ``backward`` / ``backward_end`` (the loss's gradient is
the first thing a backward computes; the parameter whose gradient completes last ends it),
``optimizer`` (the optimizer step begins), ``eval`` / ``eval_end`` and ``save`` /
``save_end`` (blocks the loop or the Trainer runs inside the step; the phase they
interrupted goes on after them).

The time between a forward's end and its backward, and between a backward's end and the
next forward, is the loop's own work between micro-batches: nanoGPT fetches its next
batch between the two, an accelerate loop at the top of each micro-batch. It is data
time, so every micro-batch's fetch counts, not the first one's only. From a backward's
end to the optimizer step (clipping, unscaling) it stays backward.
"""

from __future__ import annotations

import torch

PHASES = ("data", "forward", "backward", "optimizer", "eval", "save")
_BLOCKS = {"eval": "eval", "save": "save"}
_BLOCK_ENDS = ("eval_end", "save_end")


def _ms(a, b) -> float:
    """Milliseconds between two time marks (CUDA events: the later one has completed)."""
    return a.elapsed_time(b) if isinstance(a, torch.cuda.Event) else (b - a) * 1e3


def _label(kind: str, following: str) -> str:
    if kind == "forward_end":
        return "data" if following == "backward" else "backward"
    if kind == "backward_end":
        return "data" if following == "forward" else "backward"
    return kind


def breakdown(start, end, marks: list) -> dict[str, float | None] | None:
    """Milliseconds per phase of one step (``PHASES``; eval and save None when the step
    had none), or None when no training forward was seen (no split can be made)."""
    if not any(kind == "forward" for kind, _ in marks):
        return None
    marks = [("data", start), *marks, ("end", end)]
    # the next mark that is not an inserted block: what an ambiguous span led to
    following = ["end"] * len(marks)
    upcoming = "end"
    for i in range(len(marks) - 1, -1, -1):
        following[i] = upcoming
        kind = marks[i][0]
        if kind not in _BLOCKS and kind not in _BLOCK_ENDS:
            upcoming = kind
    totals: dict[str, float | None] = dict.fromkeys(PHASES, 0.0)
    totals["eval"] = totals["save"] = None
    interrupted = "data"
    for i, ((kind, t), (_, later)) in enumerate(zip(marks, marks[1:])):
        if kind in _BLOCKS:
            phase = _BLOCKS[kind]
        elif kind in _BLOCK_ENDS:
            phase = interrupted
        else:
            phase = interrupted = _label(kind, following[i])
        totals[phase] = (totals[phase] or 0.0) + _ms(t, later)
    return totals


class BackwardEnd:
    """Marks where each backward ends: a post-accumulate-grad hook on the trainable
    parameters (one call per parameter) for the first step, then only on the one whose
    gradient completed last, so a later step pays for one Python call per backward."""

    def __init__(self, model: torch.nn.Module, mark) -> None:
        self._mark = mark
        self._last = None
        self._handles = {}
        for p in model.parameters():
            if p.requires_grad and id(p) not in self._handles:
                try:
                    self._handles[id(p)] = p.register_post_accumulate_grad_hook(self._fired)
                except RuntimeError:  # a parameter type without the hook: no mark from it
                    continue

    def _fired(self, param) -> None:
        self._last = id(param)
        self._mark()

    def keep_last(self) -> None:
        """Keep only the hook of the parameter whose gradient completed last so far."""
        if self._last is None:
            return
        for key in [k for k in self._handles if k != self._last]:
            self._handles.pop(key).remove()

    def remove(self) -> None:
        for handle in self._handles.values():
            handle.remove()
        self._handles = {}


def loss_of(output) -> torch.Tensor | None:
    """The loss a training forward returned (``outputs.loss``, a dict's ``"loss"``, or the
    first one-element tensor with a gradient in a tuple, as nanoGPT's ``(logits, loss)``)."""
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if loss is None and isinstance(output, (tuple, list)):
        loss = next((x for x in output if isinstance(x, torch.Tensor) and x.numel() == 1
                     and x.requires_grad), None)
    return loss if isinstance(loss, torch.Tensor) and loss.requires_grad else None
