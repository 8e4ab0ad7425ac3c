"""The notes a recorded run's trial carries: how each figure was obtained where a loop
can give it several ways (the grad norm, the lr), and where the step time went."""

from __future__ import annotations

from collections import Counter

from ampscope.phases import PHASES

_NORM = {"given": "passed by the loop (rec.step(grad_norm=...))",
         "clip": "torch.nn.utils.clip_grad_norm_'s own result (before clipping)",
         "measured": "measured by AmpScope at the optimizer step: the 2-norm of the "
                     "gradients it used (unscaled, after any clipping), on the device"}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def notes(norm_methods: Counter, steps: list, lr_differed: int) -> list[str]:
    if not norm_methods:
        out = ["grad_norm: n/a (no optimizer step was seen and none was passed)"]
    else:
        out = ["grad_norm: " + "; ".join(f"{_NORM[m]} for {_plural(n, 'step')}"
                                         for m, n in norm_methods.items())]
    split = [s for s in steps if not s.warmup and s.data_ms is not None]
    total = sum(s.step_ms for s in split)
    if split and total > 0:
        shares = {name: 100 * sum(getattr(s, f"{name}_ms") or 0.0 for s in split) / total
                  for name in PHASES}
        evaluated = sum(1 for s in split if s.eval_ms)
        saved = sum(1 for s in split if s.save_ms)
        out.append(
            f"where the step time went over the {len(split)} measured steps: "
            f"{shares['data']:.0f}% waiting for data (a step's start to its first "
            f"forward, and the loop's work between micro-batches), "
            f"{shares['forward']:.0f}% forward, {shares['backward']:.0f}% "
            f"backward (to the optimizer step), {shares['optimizer']:.0f}% optimizer"
            + (f", {shares['eval']:.0f}% evaluation inside the loop (model.eval() or "
               f"no_grad forwards, in {_plural(evaluated, 'step')})" if evaluated else "")
            + (f", {shares['save']:.0f}% checkpoint saves (in {_plural(saved, 'step')})"
               if saved else ""))
    if lr_differed:
        out.append(f"lr: the lr each optimizer step used (read at the step); the lr= passed "
                   f"differed on {_plural(lr_differed, 'step')} (sched.get_last_lr() after "
                   "sched.step() is the next step's lr)")
    return out
