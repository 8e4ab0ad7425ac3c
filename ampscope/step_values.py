"""A recorded step's values: ``rec.step()``'s arguments checked, held on the device, and
written one step late as a StepSample.

A step's scalars (loss, grad norm, loss scale, tokens, lr) are copied to pinned host memory
and read one step later through engine.measure.trackers.ScalarReadback (the lrs of the other
parameter groups and ``log``'s tensors through its LateScalars), so ``step()`` never waits
for the GPU's current work. An argument that cannot be meant is warned about once and
left out (ampscope/step_args.py says what each accepts). The sample's model FLOPs, MFU and
HFU are computed as it is written. A mixin of ``ampscope.recorder.Recorder``, whose
constructor makes the state it reads.
"""

from __future__ import annotations

import functools
import math
import numbers
import time
from dataclasses import dataclass

import torch

from ampscope import phases as phases_mod
from ampscope.counting_step import COUNT_STEP
from ampscope.recorder_args import base_optimizer, readable_step
from ampscope.step_args import learning_rates, lr_differs, token_count
from engine.core.events import FlopsInfo, ScalarLog, StepSample
from engine.measure import flops as flops_mod
from engine.measure.peaks import mfu as mfu_of
from engine.measure.trackers import LateScalars

LAG = 1  # steps read back one step late: the GPU is never drained by a read
SCALARS = ("loss", "grad_norm", "scale_before", "scale_after", "tokens", "lr")


@dataclass
class PendingStep:
    index: int
    mark: object
    scalars: object  # the ScalarReadback handle of the device tensors in SCALARS
    host: dict  # the values of SCALARS already on the host (None where on the device)
    seq_len: int | None
    allocated: int | None
    reserved: int | None
    time_s: float
    phases: list  # (kind, time mark) in order: see ampscope/phases.py


def _as_float(value) -> float | None:
    if value is None:
        return None
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


def _device_tokens(tokens):
    """The tokens counted on the device (attention masks' sums), as one tensor or None."""
    if not isinstance(tokens, list):
        return tokens if isinstance(tokens, torch.Tensor) else None
    on_device = [t for t in tokens if isinstance(t, torch.Tensor)]
    return torch.stack(on_device).sum() if on_device else None


def _host_tokens(tokens) -> int | None:
    """The tokens known on the host (input ids' sizes, or the ``tokens=`` given)."""
    if isinstance(tokens, torch.Tensor):
        return None
    if not isinstance(tokens, list):
        return int(tokens) if tokens is not None else None
    counts = [t for t in tokens if not isinstance(t, torch.Tensor)]
    return sum(counts) if counts else None



class StepValues:
    """A Recorder's steps from ``rec.step()`` to the journal (see the module's docstring)."""

    def _record(self, mark, loss, tokens, grad_norm, lr) -> None:
        if self._index == COUNT_STEP:
            self._stop_watching(completed=True)
            self._stop_counting(completed=True)
        if tokens is not None:
            tokens = self._accepted("tokens", token_count(tokens), "the tokens of the "
                                    "model's training forwards are recorded instead")
        if tokens is None:
            tokens = self._forward_tokens
        self._forward_tokens = []
        allocated, reserved = self._alloc.sample(measured=self._index > COUNT_STEP)
        before, after = self._scales()
        step_lr, self._step_lr = self._step_lr, None
        step_norm, self._step_norm = self._step_norm, None
        if self._index == 0 and self._backward_end is not None:
            self._backward_end.keep_last()  # the parameter whose gradient completes last
        if lr is not None:
            groups = base_optimizer(self.optimizer)
            lr = self._accepted("lr", learning_rates(
                lr, len(groups.param_groups) if groups is not None else None),
                "the lr the optimizer step used is recorded instead")
        if lr is not None and step_lr is not None:
            # what the optimizer step used is exact whatever order the loop calls its
            # scheduler in (sched.get_last_lr() after sched.step() is the next step's lr)
            self._lr_differed += lr_differs(lr, step_lr)
            lr = None
        lrs = lr if lr is not None else step_lr
        lr = lrs[0] if lrs else None
        others = LateScalars(lrs[1:]) if lrs and len(lrs) > 1 else None  # read as group 0's
        for group, value in enumerate(lrs[1:] if lrs else [], start=1):  # journaled, all
            if value is not None:
                self._logged.append((self._index, f"lr_group{group}",
                                     functools.partial(others.value, group - 1), time.time()))
        grad_norm = self._one_number(grad_norm, "grad_norm", "pass the total norm",
                                     "AmpScope's own norm is recorded instead")
        if grad_norm is not None:
            self._measure_norm = False  # the loop gives it: AmpScope measures nothing more
            self._norm_methods["given"] += 1
        elif step_norm is not None:
            grad_norm, method = step_norm
            self._norm_methods[method] += 1
        loss = self._one_number(loss, "loss", "pass loss.mean() (or the loss you "
                                "backpropagated)", "not recorded")
        values = {"loss": loss, "grad_norm": grad_norm, "scale_before": before,
                  "scale_after": after, "tokens": _device_tokens(tokens), "lr": lr}
        host = {k: None if isinstance(v, torch.Tensor) else v for k, v in values.items()}
        host["tokens"] = _host_tokens(tokens)
        scalars = self._readback.push([values[k] if host[k] is None or k == "tokens" else None
                                       for k in SCALARS])
        phases, self._phases = self._phases, []
        self._pending.append(PendingStep(self._index, mark, scalars, host, self._seq_len,
                                      allocated, reserved, time.time(), phases))
        self._index += 1
        self.flush(LAG)

    def _accepted(self, name: str, checked: tuple, instead: str):
        """The value of a ``(value, problem)`` check, else None with one warning."""
        value, problem = checked
        if problem is not None:
            self._warn_once(name, f"rec.step({name}=...) {problem}; {instead}")
        return value

    def _one_number(self, value, name: str, fix: str, instead: str):
        """``value`` when it is one number, else None with a warning (once per name)."""
        if isinstance(value, torch.Tensor) and value.numel() != 1:
            self._warn_once(name, f"rec.step({name}=...) got a tensor of shape "
                            f"{tuple(value.shape)}, not one number: {fix}; {instead}")
            return None
        if isinstance(value, bool) or (value is not None and not isinstance(
                value, (torch.Tensor, numbers.Real))):
            self._warn_once(name, f"rec.step({name}=...) got {type(value).__name__}, not a "
                            f"number: {fix}; {instead}")
            return None
        return value

    def _scales(self):
        scaler = self.scaler
        if scaler is None or not scaler.is_enabled():
            return None, None
        scale = getattr(scaler, "_scale", None)
        # a copy on the device: read one step late, with the step's other scalars
        after = scale.detach().clone() if scale is not None else float(scaler.get_scale())
        before = self._prev_scale
        if before is None:
            before = float(getattr(scaler, "_init_scale", 0.0) or 0.0) or None
        self._prev_scale = after
        return before, after

    def _model_flops(self, tokens: int | None, seq_len: int | None) -> tuple[int | None, str]:
        if self._dims is None:
            return None, self._model_flops_reason or "model FLOPs need a transformers config"
        if not tokens or not seq_len:
            return None, "no training forward with input ids or an attention mask was seen"
        total, trainable = self._matmul
        return flops_mod.model_flops(
            tokens=tokens, matmul_params=total, trainable_matmul_params=trainable,
            attention=flops_mod.attention_stacks(self._dims, seq_len))

    def flush(self, keep: int = 0) -> None:
        """Write the recorded steps, all but the last ``keep``."""
        while len(self._pending) > keep:
            self._emit_step(self._pending.pop(0))
        if self._logged and self._run_begun:  # a step was written: its step's scalars follow
            self._emit_logged(None if keep == 0 else self.steps[-1].step if self.steps else -1)

    def patch_pending(self, index: int, **values) -> None:
        """Fill a step not yet written with host values (the Trainer's log: grad_norm)."""
        for item in self._pending:
            if item.index == index:
                item.host.update(values)

    def _emit_step(self, p: PendingStep) -> None:
        self._begin_run()
        step_ms = self._timer.sample(p.mark)
        device = dict(zip(SCALARS, self._readback.read(p.scalars)))
        got = {k: _as_float(p.host[k]) if p.host[k] is not None else device[k]
               for k in SCALARS}
        # forwards with a mask count on the device, the others on the host: both add up
        parts = [v for v in (p.host["tokens"], device["tokens"])
                 if v is not None and math.isfinite(v)]
        tokens = int(sum(parts)) if parts else None
        model_flops, formula = self._model_flops(tokens, p.seq_len)
        if self._flops is None and p.index >= COUNT_STEP:
            self._flops = self._flops_info(model_flops, formula)
        if p.index > COUNT_STEP:
            self._measured_flops.add(model_flops)
        seconds = step_ms / 1e3
        tflops = model_flops / seconds / 1e12 if model_flops and seconds > 0 else None
        mfu = mfu_of(tflops * 1e12, self._peak) if tflops is not None else None
        counted = self._counted.total if self._counted is not None else None
        hfu = mfu_of(counted / seconds, self._peak) if counted and seconds > 0 else None
        split = phases_mod.breakdown(p.mark.start, p.mark.end, p.phases) or {}
        scale, before = got["scale_after"], got["scale_before"]
        skipped = scale is not None and before is not None and scale < before
        norm = None if skipped else got["grad_norm"]
        sample = StepSample(
            precision=self.precision,
            step=p.index,
            warmup=p.index <= COUNT_STEP,
            loss=got["loss"],
            step_ms=step_ms,
            tokens_per_s=tokens / seconds if tokens and seconds > 0 else None,
            tflops=tflops,
            mfu=mfu,
            allocated_bytes=p.allocated,
            reserved_bytes=p.reserved,
            loss_scale=scale,
            skipped=skipped,
            grad_norm=norm,
            time_s=p.time_s,
            tokens=tokens,
            learning_rate=got["lr"],
            hfu=hfu,
            data_ms=split.get("data"),
            forward_ms=split.get("forward"),
            backward_ms=split.get("backward"),
            optimizer_ms=split.get("optimizer"),
            eval_ms=split.get("eval"),
            save_ms=split.get("save"),
        )
        sample = readable_step(sample, self._warn_once)
        self.steps.append(sample)
        self._emit(sample)

    def _flops_info(self, model_flops: int | None, formula: str) -> FlopsInfo:
        counted = self._counted
        return FlopsInfo(
            counted_per_step=(counted.total or None) if counted else None,
            counted_method=(
                "torch.utils.flop_counter.FlopCounterMode over the user's optimiser step "
                f"{COUNT_STEP} (hardware FLOPs; eager, after the warm-up step; forwards under "
                "no_grad or model.eval() left out)" if counted
                else f"n/a: {self._counted_reason}"),
            analytic_per_step=model_flops,
            analytic_formula=formula if model_flops else f"n/a: {formula}",
            by_op=counted.by_op if counted else {},
            by_peak_dtype=counted.by_peak_dtype if counted else {},
            model_convention=flops_mod.MODEL_FLOPS_CONVENTION,
            hardware_convention=flops_mod.HARDWARE_FLOPS_CONVENTION,
        )

    def _emit_logged(self, upto: int | None) -> None:
        """Write the logged scalars of the steps up to ``upto`` (all when None)."""
        keep = []
        for item in self._logged:
            step, name, value, when = item
            if upto is not None and step > upto:
                keep.append(item)
                continue
            number = value()
            self._emit(ScalarLog(self.precision, step, name,
                                 number if number is not None and math.isfinite(number)
                                 else None, when))
        self._logged = keep
