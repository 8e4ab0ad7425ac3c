"""``AmpScopeCallback``: the Recorder inside a ``transformers.Trainer``.

    trainer = Trainer(..., callbacks=[ampscope.AmpScopeCallback(out="run.html")])

How each figure reaches a callback that never sees a batch or a loss:
- tokens and the batch's sequence length: the Recorder's forward pre-hook on the model
  reads each training forward's ``attention_mask`` (padding excluded);
- loss: a forward hook keeps each training micro-batch's ``outputs.loss`` and sums them
  the way ``Trainer.training_step`` does (a loss the model normalised by
  ``num_items_in_batch`` is summed, any other is averaged over the micro-batches), so
  it is the value the Trainer logs;
- gradient norm: the Trainer's own (pre-clipping) norm, from its log of that step
  (``logging_steps=1`` gives every step one); otherwise the result of the
  ``clip_grad_norm_`` the Trainer calls, kept by the Recorder (the same number);
- learning rate: every parameter group's, read between the optimiser step and the
  scheduler step (``on_optimizer_step``); group 0's is the one the Trainer logs;
- precision: what the steps ran (the Recorder reads autocast inside the first training
  forward, accelerate's GradScaler, the weights' dtype); a note where ``TrainingArguments``
  asked for another (ampscope/trainer_asked.py);
- time: a step runs from its batch fetch to the end of the log, evaluation and save after
  it (see ``WRAPPED``);
- loss scale and skipped steps: the GradScaler accelerate keeps on the optimizer;
- evaluation metrics (``eval_loss`` and the rest ``on_evaluate`` gets): journaled as
  scalars at the step the evaluation followed.
Every ending ends the run: ``trainer.train()`` returning, or any exception or Ctrl-C
that leaves it (a training step, the data loading, ``optimizer.step``, another callback,
the Trainer's own bookkeeping): the callback wraps that Trainer instance's ``train`` when
the Trainer is made (``on_init_end``), and, for a callback added later with
``add_callback``, the Trainer's methods a step runs through, its callback handler and its
optimizer's ``step``; each wrapper re-raises the exception unchanged. The interpreter
exiting with the run still open ends it too. The journal gets its end line and the report
is written; the monitor thread stops; FLOPs are counted inside each training step of the
counting step only, so no dispatch mode is left pushed.

A step is written when the next one ends, as the Recorder reads every step one step late.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import sys

import torch
from transformers import TrainerCallback

from ampscope import trainer_asked
from ampscope.recorder import SOURCE_TRAINER, Recorder
from ampscope.recorder_args import check_monitor_hz


def _calling_trainer():
    """The ``Trainer`` whose ``train()`` called this callback (found on the call stack)."""
    from transformers import Trainer

    frame = inspect.currentframe()
    try:
        while frame is not None:
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, Trainer):
                return candidate
            frame = frame.f_back
        return None
    finally:
        del frame


class AmpScopeCallback(TrainerCallback):
    """Records every optimiser step of a ``Trainer`` (``out``: report at the end)."""

    def __init__(self, out=None, name=None, *, journal=None, monitor_hz: float = 5.0) -> None:
        if out is not None:
            from engine.report.writer import check_writable

            check_writable(out)  # a bad path fails now, not after hours of training
        check_monitor_hz(monitor_hz)
        self.out, self.name, self.journal, self.monitor_hz = out, name, journal, monitor_hz
        self.recorder: Recorder | None = None
        self._losses: list[tuple[torch.Tensor, bool]] = []
        self._hook = None
        self._lr: float | None = None
        self._trainer = None
        self._wrapped: list[str] = []
        self._patched: list[tuple] = []  # (object, method name, its own attribute before)
        self._spans = False  # the step is timed from the batch fetch to its log/eval/save
        self._open = False  # between the batch fetch and the step's end
        self._done = None  # (loss, lrs) of the step on_step_end closed, not yet recorded
        self._norm = None  # the Trainer's logged norm of that step: (step, {"grad_norm"})
        self._args = None

    # --- Trainer events ------------------------------------------------------------------

    def on_init_end(self, args, state, control, **kwargs):
        trainer = _calling_trainer()
        if trainer is not None and "train" not in vars(trainer):
            trainer.train = self._ending_on_exit(trainer.train)  # this instance only

    def _ending_on_exit(self, train):
        """``train`` that ends the open run on any way out of it."""

        @functools.wraps(train)
        def wrapper(*args, **kwargs):
            try:
                result = train(*args, **kwargs)
            except BaseException as exc:
                self._end(exc)
                raise
            self._end(None)  # on_train_end ended it; a callback that stopped early did not
            return result

        return wrapper

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        # the precision is what the steps ran (the Recorder reads it), except quantised
        # weights, which the model's config names
        quant = trainer_asked.quantisation(model)
        precision = quant if quant in ("nf4", "int8") else None
        scaler = getattr(optimizer, "scaler", None)  # accelerate's AcceleratedOptimizer
        name = self.name or f"{type(model).__name__} (Trainer)"
        self.recorder = Recorder(model, optimizer, scaler, self.out, name, precision=precision,
                                 journal=self.journal, monitor_hz=self.monitor_hz,
                                 source=SOURCE_TRAINER)
        self.recorder.recipe_details = trainer_asked.settings(args, model)
        self._args = args
        self._hook = model.register_forward_hook(self._on_output, with_kwargs=True)
        self.recorder.scoped_counting = True
        self._trainer = _calling_trainer()
        if self._trainer is not None:
            self._wrap(self._trainer)
        # a failure there leaves train() without passing through the Trainer's methods
        for owner, name in ((getattr(self._trainer, "callback_handler", None), "call_event"),
                            (optimizer, "step")):
            real = getattr(owner, name, None)
            if real is not None:  # an instance's own (an lr scheduler's wrapper) comes back
                self._patched.append((owner, name, vars(owner).get(name)))
                setattr(owner, name, self._ending_on_failure(real, name))
        atexit.register(self._at_exit)
        self.recorder.start()

    # The Trainer's methods a step's time is spent in, wrapped on this Trainer instance only
    # (removed when the run ends). No callback event marks where the user's wait for a step
    # begins and ends: transformers fetches the step's batches (every micro-batch of an
    # accumulated step, in get_batch_samples) before on_step_begin, and logs, evaluates
    # and saves (_maybe_log_save_evaluate) after on_step_end. So the step begins as the
    # fetch begins and ends as the log/evaluate/save that follows on_step_end returns;
    # _evaluate and _save_checkpoint are timed whole as the step's eval and save phases.
    # The counting step's FLOPs are counted inside training_step.
    WRAPPED = ("training_step", "get_batch_samples", "_maybe_log_save_evaluate", "_evaluate",
               "_save_checkpoint")

    def _wrap(self, trainer) -> None:
        for name in self.WRAPPED:
            real = getattr(trainer, name, None)
            if real is not None:
                setattr(trainer, name, self._ending_on_failure(real, name))
                self._wrapped.append(name)
        self._spans = {"get_batch_samples", "_maybe_log_save_evaluate"} <= set(self._wrapped)

    def _ending_on_failure(self, real, name: str):
        @functools.wraps(real)
        def wrapper(*args, **kwargs):
            try:
                rec = self.recorder
                if rec is None or rec._finished:
                    return real(*args, **kwargs)
                if name == "training_step":
                    with rec.counting():
                        return real(*args, **kwargs)
                if name == "get_batch_samples":
                    self._open = True
                    rec.begin_step()  # the user waits for the batches from here
                    return real(*args, **kwargs)
                if name in ("_evaluate", "_save_checkpoint"):
                    kind = "eval" if name == "_evaluate" else "save"
                    # an epoch's evaluation comes after its last step ended: it is added
                    # to that step
                    with rec.block(kind) if self._open else rec.late_block(kind):
                        return real(*args, **kwargs)
                if name == "_maybe_log_save_evaluate":
                    result = real(*args, **kwargs)
                    self._end_step()
                    return result
                return real(*args, **kwargs)
            except BaseException as exc:
                self._end(exc)
                raise

        return wrapper

    def _at_exit(self) -> None:
        # the interpreter keeps an unhandled exception here before it runs atexit
        exc = getattr(sys, "last_value", None) or RuntimeError(
            "the process exited before trainer.train() returned")
        self._end(exc)

    def _on_output(self, module, args, kwargs, output):
        loss = getattr(output, "loss", None)
        if loss is None and isinstance(output, dict):
            loss = output.get("loss")
        if module.training and isinstance(loss, torch.Tensor):
            self._losses.append((loss.detach(), kwargs.get("num_items_in_batch") is not None))

    def on_step_begin(self, args, state, control, **kwargs):
        self._losses = []
        if not self._spans:  # the Trainer was not found: the step starts here
            self.recorder.begin_step()

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        # every group's lr, as the optimizer step used it (a step the GradScaler skipped
        # runs no optimizer step for the Recorder's own hook to read)
        groups = getattr(optimizer, "param_groups", None)
        self._lr = [float(g["lr"]) for g in groups] if groups else None

    def on_step_end(self, args, state, control, **kwargs):
        self._done = (self._step_loss(), self._lr)
        if not self._spans:
            self._end_step()

    def _end_step(self) -> None:
        """Record the step on_step_end closed (the log, evaluation and save after it done)."""
        done, self._done, self._open = self._done, None, False
        if done is None or self.recorder is None or self.recorder._finished:
            return
        self.recorder.end_step(done[0], lr=done[1])
        norm, self._norm = self._norm, None
        if norm is not None:
            self.recorder.patch_pending(norm[0], **norm[1])

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.recorder is None or not logs or "loss" not in logs:
            return
        index = state.global_step - 1
        previous = [h.get("step") for h in state.log_history[:-1] if "loss" in h]
        covers_one_step = (previous[-1] if previous else 0) == state.global_step - 1
        if covers_one_step and "grad_norm" in logs:  # the Trainer's norm of exactly this step
            norm = (index, {"grad_norm": logs["grad_norm"]})
            if self._done is not None:  # the step is still open: kept for its end
                self._norm = norm
            else:
                self.recorder.patch_pending(norm[0], **norm[1])

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        """The evaluation metrics the Trainer logs (eval_loss...), journaled at the step
        they follow; an evaluate() after train() returned has no run to go to."""
        rec = self.recorder
        if rec is None or rec._finished or not metrics:
            return
        numbers = {k: v for k, v in metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "epoch"}
        rec.log_at(max(state.global_step - 1, 0), **numbers)

    def on_train_end(self, args, state, control, **kwargs):
        self._end(None)

    def _end(self, exc) -> None:
        atexit.unregister(self._at_exit)
        self._end_step()  # a step whose evaluation or save was cut short is kept
        if self.recorder is not None and not self.recorder._finished:
            rec = self.recorder
            rec.asked_notes = trainer_asked.notes(self._args, rec.precision,
                                                  rec.describe_recipe(), rec.device.type)
        trainer, self._trainer = self._trainer, None
        for name in self._wrapped:  # the instance attributes go: the class's methods return
            trainer.__dict__.pop(name, None)
        self._wrapped = []
        for owner, name, before in reversed(self._patched):
            if before is None:
                vars(owner).pop(name, None)
            else:
                setattr(owner, name, before)
        self._patched = []
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.recorder is not None:
            self.recorder.finish(exc)

    def _step_loss(self) -> torch.Tensor | None:
        if not self._losses:
            return None
        scaled = [loss for loss, normalised in self._losses if normalised]
        plain = [loss for loss, normalised in self._losses if not normalised]
        total = torch.zeros((), dtype=torch.float32, device=self._losses[0][0].device)
        for loss in scaled:
            total = total + loss.float()
        if plain:
            total = total + torch.stack([x.float() for x in plain]).sum() / len(plain)
        return total
