"""``Recorder``: AmpScope's measurements around a training loop the user wrote.

    with ampscope.Recorder(model, optimizer, scaler, out="run.html") as rec:
        for batch in loader:
            ...forward, backward, optimizer step...
            rec.step(loss=loss)

Conventions (docs/report-schema.md, "User runs"):
- a step's time runs from the previous ``step()`` call (or from the start) to this one,
  so it includes the loop's data loading; ``with rec.step_timer() as s:`` times only
  the block instead (set ``s.loss`` inside it);
- step 0 is a warm-up step: hardware FLOPs are counted in it with FlopCounterMode (the
  counter watches the ops, it changes no value), and its time includes the counter;
- tokens: ``tokens=`` when given, else the non-padding tokens of the training forwards
  since the last step (``attention_mask.sum()`` when the model gets a mask, else the
  input ids' size), read by a forward pre-hook on the model;
- model FLOPs (the MFU numerator, DESIGN.md convention 13) are the analytic formula of
  engine/flops.py over those tokens at the batch's sequence length; a model without a
  transformers config has none (n/a, with the reason);
- a skipped step is one where the GradScaler's scale went down;
- on a GPU a step is read back while the next one runs (no extra host sync), so the
  journal is one step behind; on the CPU each step is written when it ends.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from engine import flops as flops_mod
from engine import inventory
from engine.config import PRECISIONS
from engine.device import probe
from engine.environment import collect
from engine.events import (
    ErrorEvent,
    FlopsInfo,
    MemoryBreakdown,
    RunFinished,
    RunStarted,
    StepSample,
    TrialFinished,
    TrialResult,
    TrialStarted,
    TrialSummary,
)
from engine.journal import JournalWriter, journal_path
from engine.monitor import Monitor
from engine.peaks import mfu as mfu_of
from engine.peaks import peak_flops
from engine.recipes import recipe as recipe_of
from engine.record import RunRecord
from engine.spread import step_spread
from engine.trackers import AllocatorTracker, StepTimer

SOURCE_LOOP = "user-loop"
SOURCE_TRAINER = "user-trainer"


@dataclass
class TimedStep:
    """What ``step_timer()`` yields: set ``loss`` (and optionally the others) inside."""

    loss: object = None
    tokens: int | None = None
    grad_norm: object = None
    lr: float | None = None


@dataclass
class _Pending:
    index: int
    mark: object
    loss: object
    tokens: object
    seq_len: int | None
    grad_norm: object
    lr: float | None
    scale_before: object
    scale_after: object
    allocated: int | None
    reserved: int | None
    time_s: float


def _first_param(model: torch.nn.Module) -> torch.nn.Parameter | None:
    return next(iter(model.parameters()), None)


def _as_float(value) -> float | None:
    if value is None:
        return None
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


def _tensor_bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


class Recorder:
    """Records every optimiser step of a hand-written loop into a run journal and a report.

    ``out``: a report written when the loop ends (``.json``, ``.html`` or ``.csv``).
    ``name``: the run's name (the model's class by default). ``precision``: one of
    AmpScope's precision names, inferred when not given (the first forward's autocast
    dtype, the weights' dtype and the scaler). ``journal``: the journal file
    (``runs/<run id>.jsonl`` in the data folder by default).
    """

    def __init__(self, model: torch.nn.Module, optimizer, scaler=None, out=None, name=None, *,
                 precision: str | None = None, journal=None, monitor_hz: float = 5.0,
                 source: str = SOURCE_LOOP, recipe: str | None = None) -> None:
        if not isinstance(model, torch.nn.Module):
            raise ValueError("Recorder needs the torch.nn.Module you train as its first argument")
        if precision is not None and precision not in PRECISIONS:
            raise ValueError(f"unknown precision '{precision}': choose from "
                             f"{', '.join(PRECISIONS)}, or leave it out to infer it")
        if not monitor_hz > 0:
            raise ValueError(f"monitor_hz must be above 0 (got {monitor_hz})")
        self.out = None
        if out is not None:
            from engine.report.writer import check_writable

            self.out = check_writable(out)
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.name = name or type(model).__name__
        self.source = source
        self._precision = precision
        self._recipe_text = recipe
        param = _first_param(model)
        self.device = param.device if param is not None else torch.device("cpu")
        self.device_info = probe("cpu" if self.device.type == "cpu"
                                 else f"cuda:{self.device.index or 0}")
        self.run_id = uuid.uuid4().hex[:12]
        self.journal_file = journal or journal_path(self.run_id)
        self.record = RunRecord()
        self.report_path = None
        self._monitor_hz = monitor_hz
        self._lock = threading.Lock()
        self._journal: JournalWriter | None = None
        self._early: list = []  # monitor samples before the run's first event
        self._timer = StepTimer(self.device)
        self._alloc = AllocatorTracker(self.device)
        self._pending: list[_Pending] = []
        self.steps: list[StepSample] = []
        self.hold = False  # the Trainer callback emits a step only once its log is in
        self._index = 0
        self._started = False
        self._finished = False
        self._counter = None
        self._flops: FlopsInfo | None = None
        self._model_flops_reason: str | None = None
        self._hooks: list = []
        self._forward_tokens: list = []
        self._seq_len: int | None = None
        self._autocast: torch.dtype | None = None
        self._autocast_seen = False
        self._monitor: Monitor | None = None
        self._prev_scale = None
        self._started_s = time.time()
        self._timed = False

    # --- life cycle --------------------------------------------------------------------

    def __enter__(self) -> Recorder:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.finish(exc)
        return False  # the user's exception goes on

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        self._started_s = time.time()
        self._hooks.append(self.model.register_forward_pre_hook(self._on_forward,
                                                                with_kwargs=True))
        self._dims = self._model_dims()
        self._matmul = flops_mod.matmul_param_counts(self.model)
        self._monitor = Monitor.for_device(self.device_info, self._emit, self._monitor_hz)
        self._monitor.start()
        # hardware FLOPs: everything torch runs up to the end of the first step
        tf32 = self.device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32
        self._counter, self._by_dtype = flops_mod.counting_mode(tf32)
        self._counter.__enter__()
        self._timer.start()
        self._alloc.start()

    def _model_dims(self) -> dict | None:
        from engine.models import dims

        config = getattr(self.model, "config", None)
        try:
            return dims(config) if config is not None else None
        except Exception as exc:  # a config without the usual names: no analytic formula
            self._model_flops_reason = f"model FLOPs need a transformers config ({exc})"
            return None

    def _on_forward(self, module, args, kwargs):
        if not module.training:  # evaluation forwards are not training steps
            return None
        if not self._autocast_seen:
            self._autocast_seen = True
            kind = self.device.type
            if torch.is_autocast_enabled(kind):
                self._autocast = torch.get_autocast_dtype(kind)
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

    # --- steps -------------------------------------------------------------------------

    def step(self, loss=None, tokens: int | None = None, grad_norm=None,
             lr: float | None = None) -> None:
        """Call once per optimiser step, after ``optimizer.step()`` (and ``scaler.update()``)."""
        if not self._started:
            self.start()
        mark = self._timer.stop()
        self._record(mark, loss, tokens, grad_norm, lr)
        self._timer.start()
        self._alloc.start()

    @contextmanager
    def step_timer(self):
        """Times one optimiser step: ``with rec.step_timer() as s: ...; s.loss = loss``."""
        if not self._started:
            self.start()
        step = TimedStep()
        self.begin_step()
        yield step
        self.end_step(step.loss, step.tokens, step.grad_norm, step.lr)

    def begin_step(self) -> None:
        self._timer.start()
        self._alloc.start()

    def end_step(self, loss=None, tokens=None, grad_norm=None, lr=None) -> None:
        self._record(self._timer.stop(), loss, tokens, grad_norm, lr)

    def _record(self, mark, loss, tokens, grad_norm, lr) -> None:
        if self._counter is not None:
            self._count_flops()
        if tokens is None:
            tokens = self._forward_tokens
        self._forward_tokens = []
        allocated, reserved = self._alloc.sample(measured=self._index > 0)  # step 0: warm-up
        before, after = self._scales()
        if isinstance(loss, torch.Tensor):
            loss = loss.detach()
        if lr is None and self.optimizer is not None and self.optimizer.param_groups:
            lr = self.optimizer.param_groups[0].get("lr")
        self._pending.append(_Pending(
            self._index, mark, loss, tokens, self._seq_len, grad_norm,
            _as_float(lr), before, after, allocated, reserved, time.time()))
        self._index += 1
        # on the CPU reading a value costs nothing; on a GPU wait for the next step
        keep = 0 if self.device.type == "cpu" else 1
        if not self.hold:
            self.flush(keep)

    def _scales(self):
        scaler = self.scaler
        if scaler is None or not scaler.is_enabled():
            return None, None
        scale = getattr(scaler, "_scale", None)
        after = scale.detach().clone() if scale is not None else float(scaler.get_scale())
        before = self._prev_scale
        if before is None:
            before = float(getattr(scaler, "_init_scale", 0.0) or 0.0) or None
        self._prev_scale = after
        return before, after

    def _count_flops(self) -> None:
        counter, self._counter = self._counter, None
        counter.__exit__(None, None, None)
        self._counted = flops_mod.counted(counter, self._by_dtype)

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

    def patch_pending(self, index: int, **values) -> None:
        """Fill a held step's fields (the Trainer callback's log: loss, grad_norm, lr)."""
        for item in self._pending:
            if item.index == index:
                for key, value in values.items():
                    setattr(item, key, value)

    def _emit_step(self, p: _Pending) -> None:
        self._begin_run()
        step_ms = self._timer.sample(p.mark)
        tokens = p.tokens
        if isinstance(tokens, list):
            tokens = sum(int(t.item()) if isinstance(t, torch.Tensor) else int(t)
                         for t in tokens) if tokens else None
        model_flops, formula = self._model_flops(tokens, p.seq_len)
        if self._flops is None:
            counted = self._counted
            self._flops = FlopsInfo(
                counted_per_step=counted.total or None,
                counted_method=("torch.utils.flop_counter.FlopCounterMode over the first "
                                "optimiser step of the user's run (hardware FLOPs)"),
                analytic_per_step=model_flops,
                analytic_formula=formula if model_flops else f"n/a: {formula}",
                by_op=counted.by_op,
                by_peak_dtype=counted.by_peak_dtype,
                model_convention=flops_mod.MODEL_FLOPS_CONVENTION,
                hardware_convention=flops_mod.HARDWARE_FLOPS_CONVENTION,
            )
        seconds = step_ms / 1e3
        tflops = model_flops / seconds / 1e12 if model_flops and seconds > 0 else None
        mfu = mfu_of(tflops * 1e12, self._peak) if tflops is not None else None
        scale = _as_float(p.scale_after)
        before = _as_float(p.scale_before)
        skipped = scale is not None and before is not None and scale < before
        norm = None if skipped else _as_float(p.grad_norm)
        sample = StepSample(
            precision=self.precision,
            step=p.index,
            warmup=p.index == 0,
            loss=_as_float(p.loss),
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
            learning_rate=p.lr,
        )
        self.steps.append(sample)
        self._emit(sample)

    # --- the run's events --------------------------------------------------------------

    @property
    def precision(self) -> str:
        if self._precision is None:
            self._precision = self._infer_precision()
        return self._precision

    def _infer_precision(self) -> str:
        param = _first_param(self.model)
        weights = param.dtype if param is not None else torch.float32
        scaled = self.scaler is not None and self.scaler.is_enabled()
        if weights == torch.float16:
            return "fp16"
        if weights == torch.bfloat16:
            return "bf16"
        if self._autocast == torch.float16 or scaled:
            return "fp16-amp"
        if self._autocast == torch.bfloat16:
            return "bf16-amp"
        if self.device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
            return "tf32"
        return "fp32"

    def describe_recipe(self) -> str:
        if self._recipe_text:
            return self._recipe_text
        scaler = "GradScaler" if self.scaler is not None and self.scaler.is_enabled() else (
            "no loss scaling")
        autocast = (f"autocast {str(self._autocast).removeprefix('torch.')}"
                    if self._autocast is not None else "no autocast")
        param = _first_param(self.model)
        weights = str(param.dtype).removeprefix("torch.") if param is not None else "no"
        optimizer = type(self.optimizer).__name__ if self.optimizer is not None else "none"
        return f"user loop: {weights} weights, {autocast}, {scaler}, optimizer {optimizer}"

    def _begin_run(self) -> None:
        if self._journal is not None:
            return
        info = self.device_info  # a MIG slice's peak is its share of the GPU's SMs
        self._peak = peak_flops(info.name if info.kind == "cuda" else None,
                                recipe_of(self.precision).peak_dtype,
                                sm_count=info.sm_count, mig=info.mig)
        self._journal = JournalWriter(self.journal_file)
        config = {"model": self.name, "precisions": [self.precision],
                  "device": str(self.device), "source": self.source,
                  "optimizer": type(self.optimizer).__name__ if self.optimizer else None,
                  "recipe": self.describe_recipe()}
        now = time.time()
        self._emit(RunStarted(self.run_id, config, collect(self.device_info), self._started_s))
        self._emit(TrialStarted(self.precision, 0, 1, now))
        with self._lock:
            early, self._early = self._early, []
        for sample in early:
            self._emit(sample)

    def _emit(self, event) -> None:
        with self._lock:
            if self._journal is None:  # monitor samples before the first step
                self._early.append(event)
                return
            self._journal.write(event)
            self.record.apply(event)

    def finish(self, exc: BaseException | None = None) -> RunRecord:
        """End the run: the last steps, the trial's result, the report. Idempotent."""
        if self._finished:
            return self.record
        self._finished = True
        if self._counter is not None:
            self._count_flops()
        for hook in self._hooks:
            hook.remove()
        if self._monitor is not None:
            self._monitor.stop()
        if not hasattr(self, "_counted"):
            self._counted = flops_mod.Counted(0)
        try:
            self.flush()
        finally:
            self._begin_run()
            status, reason = "ok", None
            if exc is not None:
                if isinstance(exc, KeyboardInterrupt):
                    status, reason = "cancelled", "stopped by Ctrl-C in the user's script"
                else:
                    status, reason = "error", f"{type(exc).__name__}: {exc}"
                    self._emit(ErrorEvent(f"the user's training raised {reason}",
                                          self.precision, time.time()))
            result = self._result(status, reason)
            self._emit(TrialFinished(result, time.time()))
            self._emit(RunFinished("ok" if status == "ok" else status, time.time()))
            self._journal.close()
        if self.out is not None:
            from engine.report.writer import write_report

            self.report_path = write_report(self.record, self.out)
        return self.record

    def _result(self, status: str, reason: str | None) -> TrialResult:
        params, trainable = inventory.count_params(self.model)
        return TrialResult(
            precision=self.precision,
            status=status,
            reason=reason,
            recipe=self.describe_recipe(),
            device=self.device_info.describe(),
            param_count=params,
            trainable_params=trainable,
            memory=self._memory(),
            dtype_map=inventory.dtype_map(self.model),
            module_tree=inventory.module_tree(self.model),
            flops=self._flops,
            steps=list(self.steps),
            summary=self._summary(),
            started_s=self._started_s,
            finished_s=time.time(),
            source=self.source,
        )

    def _memory(self) -> MemoryBreakdown:
        params_bytes = inventory.unique_param_bytes(self.model) + sum(
            b.numel() * b.element_size() for b in self.model.buffers())
        # a gradient has its parameter's dtype and shape
        grads = sum(p.numel() * p.element_size() for p in self.model.parameters()
                    if p.requires_grad)
        opt = (sum(_tensor_bytes(s) for s in self.optimizer.state.values())
               if self.optimizer is not None else 0)
        known = params_bytes + grads + opt
        peak_alloc, peak_res, covers = self._alloc.stop()
        common = dict(
            params_bytes=params_bytes, grads_bytes=grads, optimizer_bytes=opt,
            activations_bytes=None,
            activations_method="not measured in a user's run (AmpScope does not wrap the "
                               "user's forward in saved-tensor hooks)",
        )
        if peak_alloc is None:
            return MemoryBreakdown(
                **common, total_bytes=known,
                total_method="parameters + gradients + optimizer state, exact tensor bytes "
                             "(no allocator peak counter on the CPU; host RSS is in the "
                             "monitor samples)")
        return MemoryBreakdown(
            **common, peak_allocated_bytes=peak_alloc, peak_reserved_bytes=peak_res,
            temporaries_bytes=None, total_bytes=peak_alloc,
            total_method=f"torch.cuda.max_memory_allocated {covers}")

    def _summary(self) -> TrialSummary:
        measured = [s for s in self.steps if not s.warmup]
        seconds = sum(s.step_ms for s in measured) / 1e3
        tokens = [s.tokens for s in measured]
        known_tokens = bool(measured) and all(tokens)
        tps = sum(tokens) / seconds if known_tokens and seconds > 0 else None
        flops = [s.tflops * s.step_ms / 1e3 for s in measured if s.tflops is not None]
        tflops = (sum(flops) / seconds if measured and len(flops) == len(measured)
                  and seconds > 0 else None)
        peak = getattr(self, "_peak", None)
        mfu = mfu_of(tflops * 1e12, peak) if tflops is not None and peak else None
        if not measured:
            reason = "no steps measured after the warm-up step"
        elif peak is not None and peak.flops_per_s is None:
            reason = peak.reason
        elif tflops is None:
            reason = self._flops.analytic_formula if self._flops else "no model FLOPs"
        else:
            reason = None
        last = self.steps[-1] if self.steps else None
        same_tokens = known_tokens and len(set(tokens)) == 1
        mem = self._memory()
        return TrialSummary(
            steps_measured=len(measured),
            median_step_ms=statistics.median(s.step_ms for s in measured) if measured else None,
            tokens_per_s=tps,
            tflops=tflops,
            mfu=mfu,
            mfu_reason=reason,
            peak_flops=peak.flops_per_s if peak else None,
            peak_flops_source=peak.source if peak else None,
            peak_memory_bytes=mem.total_bytes,
            peak_memory_method=mem.total_method,
            skipped_steps=sum(1 for s in self.steps if s.skipped),
            final_loss=last.loss if last else None,
            final_loss_scale=last.loss_scale if last else None,
            # its tokens/s interval assumes one token count per step
            spread=step_spread(self.steps, tokens[0]) if same_tokens else None,
        )
