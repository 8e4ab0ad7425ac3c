"""``Recorder``: AmpScope's measurements around a training loop the user wrote.

    with ampscope.Recorder(model, optimizer, scaler, out="run.html") as rec:
        for batch in loader:
            ...forward, backward, optimizer step...
            rec.step(loss=loss)

Conventions (docs/report-schema.md, "User runs"):
- a step's time runs from the previous ``step()`` call (or from the start: the ``with``,
  ``start()``, or, for a Recorder made without them, its making, the recording itself
  starting at the model's first forward) to this one, so it includes the loop's data
  loading; ``with rec.step_timer() as s:`` times only the block instead (set ``s.loss``
  inside it);
- step 0 is a warm-up step (``torch.compile`` compiles there); step 1 is the counting
  step: hardware FLOPs are counted over it with FlopCounterMode (the counter watches the
  ops, it changes no value; a compiled model runs eagerly under it, so nothing compiles
  while it counts), and its time includes the counter. Both are left out of the summary,
  whose figures are medians over the measured steps, as a profile trial's are;
- tokens: ``tokens=`` when given, else the non-padding tokens of the training forwards
  since the last step (``attention_mask.sum()`` when the model gets a mask, else the
  input ids' size), read by a forward pre-hook on the model;
- model FLOPs (the MFU numerator, DESIGN.md convention 13) are the analytic formula of
  engine/measure/flops.py over those tokens at the batch's sequence length; a model without a
  transformers config has none (n/a, with the reason);
- a skipped step is one where the GradScaler's scale went down;
- lr: every group's, as the optimizer step used it (an optimizer step pre-hook, before a
  scheduler moves it; preferred to ``lr=``, which is one step late after the scheduler's
  step); grad norm: the one passed, else ``clip_grad_norm_``'s result on the model's
  parameters, else measured on the device just before the optimizer step (notes say which);
- evaluation forwards (``model.eval()`` or ``no_grad``) count neither tokens nor FLOPs;
- a step's time is split at the model's training forwards, its backwards and the
  optimizer step into data, forward, backward, optimizer (and eval, save) milliseconds
  (CUDA events on a GPU; ampscope/phases.py);
- ``rec.log()`` before the step's first training forward is at the step it followed;
- memory: step 1 (untimed by the summary) is also watched by engine.measure.memtrack, as a profile
  trial's memory step is: every storage from allocation to release, so the report has the
  real peak of a step and what held it (parameters, gradients, optimizer state,
  activations, temporaries), on the CPU too;
- a step's scalars (loss, grad norm, loss scale, tokens, lr) are copied to pinned host memory
  and read one step later through engine.measure.trackers.ScalarReadback (the lrs of the other
  parameter groups and ``log``'s tensors through its LateScalars), so ``step()`` never
  waits for the GPU's current work; the journal is one step behind, on every device (the
  CPU runs the same path the GPU does).
"""

from __future__ import annotations

import atexit
import functools
import sys
import threading
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from ampscope import phases as phases_mod
from ampscope import what_ran
from ampscope.clip_norm import ClipNormKeeper
from ampscope.counting_step import CountingStep
from ampscope.never_raises import never_raises
from ampscope.ranks import rank_and_world, shared_run_id
from ampscope.recorder_args import base_optimizer, check_arguments
from ampscope.run_journal import RunJournal
from ampscope.step_hooks import StepHooks
from ampscope.step_values import LAG, SCALARS, PendingStep, StepValues
from engine.core.config import PRECISIONS
from engine.core.events import FlopsInfo, StepSample
from engine.measure import flops as flops_mod
from engine.measure import memtrack
from engine.measure.device import probe
from engine.measure.monitor import Monitor
from engine.measure.trackers import AllocatorTracker, LateScalars, ScalarReadback, StepTimer
from engine.record.bounded import MAX_NAME, cut
from engine.record.journal import JournalWriter, journal_path
from engine.record.rank_journals import rank_journal_path
from engine.record.run_record import RunRecord

SOURCE_LOOP = "user-loop"
SOURCE_TRAINER = "user-trainer"


@dataclass
class TimedStep:
    """What ``step_timer()`` yields: set ``loss`` (and optionally the others) inside."""

    loss: object = None
    tokens: int | None = None
    grad_norm: object = None
    lr: float | None = None


def _first_param(model: torch.nn.Module) -> torch.nn.Parameter | None:
    return next(iter(model.parameters()), None)


class Recorder(StepHooks, CountingStep, StepValues, RunJournal):
    """Records every optimiser step of a hand-written loop into a run journal and a report.

    ``out``: a report written when the loop ends (``.json``, ``.html`` or ``.csv``).
    ``name``: the run's name (the model's class by default). ``precision``: one of
    AmpScope's precision names, inferred when not given (the first training forward's
    autocast dtype, else the dtype most counted matmul FLOPs ran in; the weights' dtype;
    the scaler; TF32 through ``fp32_precision``). ``journal``: a new journal file
    (``runs/<run id>.jsonl`` in the data folder by default). ``optimizer`` may be None:
    no lr, optimizer state or measured grad norm then.

    The parts of its work live beside it: ampscope/step_hooks.py (hooks on the model and
    optimizer), counting_step.py (step 1's FLOP counter and memory watcher),
    step_values.py (a step's values, written one step late) and run_journal.py (the
    journal, the run's start and end).
    """

    def __init__(self, model: torch.nn.Module, optimizer=None, scaler=None, out=None,
                 name=None, *,
                 precision: str | None = None, journal=None, monitor_hz: float = 5.0,
                 source: str = SOURCE_LOOP, recipe: str | None = None) -> None:
        if not isinstance(model, torch.nn.Module):
            raise ValueError("Recorder needs the torch.nn.Module you train as its first argument")
        if precision is not None and precision not in PRECISIONS:
            raise ValueError(f"unknown precision '{precision}': choose from "
                             f"{', '.join(PRECISIONS)}, or leave it out to infer it")
        check_arguments(optimizer, base_optimizer(optimizer), scaler, monitor_hz)
        self.out = None
        if out is not None:
            from engine.report.writer import check_writable

            self.out = check_writable(out)
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.name = name or type(model).__name__
        if len(str(self.name)) > MAX_NAME:  # the reader refuses longer names: cut, not lost
            warnings.warn(f"ampscope: the run's name has {len(str(self.name)):,} characters; "
                          f"the journal keeps the first part ({MAX_NAME:,} at most)",
                          RuntimeWarning, stacklevel=2)
        self.name = cut(str(self.name), MAX_NAME)
        self.source = source
        self._precision = precision
        self._recipe_text = recipe
        param = _first_param(model)
        self.device = param.device if param is not None else torch.device("cpu")
        if self.device.type == "meta":
            raise ValueError("the model's parameters are on the meta device (shapes without "
                             "data), so it cannot train: load its weights (from_pretrained, "
                             "or model.to_empty(device=...) and initialise) before recording")
        self.device_info = probe("cpu" if self.device.type == "cpu"
                                 else f"cuda:{self.device.index or 0}")
        # under torchrun every rank records: one journal each, named by rank, one run id
        self.rank, self.world_size = rank_and_world()
        self.run_id = shared_run_id(self.world_size)
        self.journal_file = Path(journal) if journal is not None else journal_path(self.run_id)
        if self.world_size > 1:
            if journal is None and rank_journal_path(self.journal_file, self.rank).exists():
                # a launch that repeated an earlier one's rendezvous id, port and launcher
                warnings.warn(f"ampscope: run {self.run_id} was journaled before: this rank "
                              "records as a run of its own, not merged with the others",
                              RuntimeWarning, stacklevel=2)
                self.run_id = uuid.uuid4().hex[:12]
                self.journal_file = journal_path(self.run_id)
            self.journal_file = rank_journal_path(self.journal_file, self.rank)
        if journal is not None and self.journal_file.exists():
            raise ValueError(f"the journal file {self.journal_file} already exists (a run "
                             "journal holds one run): pick a new file name, or leave "
                             "journal= out for runs/<run id>.jsonl in the data folder")
        self.record = RunRecord()
        self.report_path = None
        self._monitor_hz = monitor_hz
        self._lock = threading.Lock()
        self._journal: JournalWriter | None = None
        self._early: list = []  # monitor samples before the run's first event
        self._timer = StepTimer(self.device)
        self._alloc = AllocatorTracker(self.device)
        self._pending: list[PendingStep] = []
        self._readback = ScalarReadback(self.device, width=len(SCALARS), slots=LAG + 3)
        self.steps: list[StepSample] = []
        self._index = 0
        self._started = False
        self._finished = False
        self._counter = None
        self._counted: flops_mod.Counted | None = None
        self._peak_for: tuple | None = None  # (what it was chosen from, the PeakLookup)
        self._watcher: memtrack.MemoryWatcher | None = None  # over the counting step
        self._measured: memtrack.MeasuredPeak | None = None
        self._counted_reason = "the run ended before its FLOP-counting step (step 1) ended"
        self._eval_mark = None  # the counter's tallies when an evaluation forward began
        self._excluded = (Counter(), Counter())  # evaluation FLOPs: by op, by dtype
        self._count_ops: Counter = Counter()  # the counting step's FLOPs so far, by op
        self._count_dtypes: Counter = Counter()  # ... and by peak dtype
        self.scoped_counting = False  # True: only counting() blocks count (the Trainer)
        self._flops: FlopsInfo | None = None
        self._measured_flops: set = set()  # model FLOPs of the measured steps: one, or many
        self._model_flops_reason: str | None = None
        self._hooks: list = []
        self._forward_tokens: list = []
        self._seq_len: int | None = None
        self._autocast: torch.dtype | None = None
        self._autocast_probe: what_ran.AutocastProbe | None = None
        self.recipe_details: str | None = None  # the Trainer's settings, after what ran
        self._monitor: Monitor | None = None
        self._prev_scale = None
        self._started_s = time.time()
        self._run_begun = False
        # what the optimizer step of the current step used: lr, and the grad norm when the
        # loop gives none (measured on the device, or clip_grad_norm_'s own result)
        self._step_lr = None
        self._step_norm = None
        self._norm_methods: Counter = Counter()
        self._measure_norm = True
        self._clip_patch = None
        self._warned: set[str] = set()
        self._failed_steps = 0  # rec.step() calls whose recording failed
        self._log_step: int | None = None  # log_at's step while it logs
        self._phases: list = []  # this step's time marks (see PendingStep.phases)
        self._in_forward = False
        self._in_eval = False  # inside an evaluation forward (model.eval() or no_grad)
        self._in_block = False  # inside block(): an evaluation or save timed as a whole
        self._backward_end: phases_mod.BackwardEnd | None = None
        self.asked_notes: list[str] = []  # where what was asked for is not what ran
        self._lr_differed = 0  # steps whose lr= was not the lr their optimizer step used
        # made without `with` or start(): step 0 starts here, as the with form's does, and
        # the recording starts at the model's first forward (its hooks, in time for step 0)
        self._made = (time.time(), self._timer.now())
        self._autostart = model.register_forward_pre_hook(self._start_at_first_forward,
                                                          with_kwargs=True)
        # rec.log() and the lrs of groups past the first, not yet written: (step, name, a
        # LateScalars read of the value, time)
        self._logged: list[tuple[int, str, Callable[[], float | None], float]] = []

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(f"ampscope: {message}", RuntimeWarning, stacklevel=3)

    # --- life cycle --------------------------------------------------------------------

    def __enter__(self) -> Recorder:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.finish(exc)
        return False  # the user's exception goes on

    def start(self) -> None:
        if self._finished:
            raise RuntimeError(f"this Recorder already finished its run ({self.run_id}): make "
                               "a new ampscope.Recorder for a new run")
        if self._started:
            return
        self._started = True
        self._started_s = time.time()
        self._autostart.remove()
        self._journal = self._open_journal()
        print(f"ampscope: recording run {self.run_id} to {self.journal_file} "
              f"(follow it with: python3 main.py watch {self.journal_file})", file=sys.stderr)
        base = base_optimizer(self.optimizer)
        if base is not None:
            self._hooks.append(base.register_step_pre_hook(self._before_optimizer_step))
        self._clip_patch = ClipNormKeeper(self.model, self._clip_norm)
        self._hooks.append(self.model.register_forward_pre_hook(self._on_forward,
                                                                with_kwargs=True))
        self._hooks.append(self.model.register_forward_hook(self._after_forward))
        self._backward_end = phases_mod.BackwardEnd(self.model,
                                                    lambda: self._mark("backward_end"))
        self._dims = self._model_dims()
        self._matmul = flops_mod.matmul_param_counts(self.model)
        self._monitor = Monitor.for_device(self.device_info, self._emit, self._monitor_hz)
        self._monitor.start()
        atexit.register(self._at_exit)  # a script that dies without finish() still ends
        self._timer.start()
        self._alloc.start()

    def _start_at_first_forward(self, module, args, kwargs):
        """The constructor form's start: at the model's first forward, timed from when the
        Recorder was made (the forward's own hooks are added now, so it is called here)."""
        if self._started or self._finished:
            return None
        self._guarded(self.start)
        self._started_s = self._made[0]
        self._timer.start(at=self._made[1])
        return self._on_forward(module, args, kwargs)

    def _at_exit(self) -> None:
        # the interpreter keeps an unhandled exception here before it runs atexit
        self.finish(getattr(sys, "last_value", None) or RuntimeError(
            "the process exited without finishing the Recorder (no finish(), no with block)"))

    def _model_dims(self) -> dict | None:
        from engine.models.load import dims

        config = getattr(self.model, "config", None)
        if config is None:  # DDP keeps the model in .module
            config = getattr(getattr(self.model, "module", None), "config", None)
        try:
            return dims(config) if config is not None else None
        except Exception as exc:  # a config without the usual names: no analytic formula
            self._model_flops_reason = f"model FLOPs need a transformers config ({exc})"
            return None

    @property
    def _tf32(self) -> bool:
        return self.device_info.kind == "cuda" and what_ran.tf32_matmuls()

    # --- steps -------------------------------------------------------------------------

    @never_raises
    def step(self, loss=None, tokens: int | None = None, grad_norm=None,
             lr: float | None = None) -> None:
        """Call once per optimiser step, after ``optimizer.step()`` (and ``scaler.update()``)."""
        if self._finished:
            self._warn_once("finished", f"this Recorder already finished its run "
                            f"({self.run_id}): steps after the end are not recorded; make a "
                            "new ampscope.Recorder for a new run")
            return
        if not self._started:  # the constructor form, no forward seen: from construction
            self.start()
            self._started_s = self._made[0]
            self._timer.start(at=self._made[1])
        mark = self._timer.stop()
        try:
            self._record(mark, loss, tokens, grad_norm, lr)
        finally:  # the next step is timed whatever happened to this one's record
            self._begin_count_step()
            self._timer.start()
            self._alloc.start()

    @never_raises
    def log(self, **scalars) -> None:
        """Journal scalars: ``rec.log(eval_loss=..., accuracy=...)``. Before the step's first
        training forward (an evaluation at the top of an iteration, or after the loop's last
        step) they are journaled at the step they followed; after it, at the step in
        progress (step 0 has none before it).

        A tensor is read with its step's other values, one step late (no host sync)."""
        if self._finished:
            self._warn_once("finished", f"this Recorder already finished its run "
                            f"({self.run_id}): rec.log() after the end is not recorded")
            return
        now, kept = time.time(), {}
        for name, value in scalars.items():
            if isinstance(value, torch.Tensor) and value.numel() != 1:
                self._warn_once(f"log-{name}", f"rec.log({name}=...) got a tensor of shape "
                                f"{tuple(value.shape)}: pass one number")
            elif not isinstance(value, torch.Tensor) and (
                    isinstance(value, bool) or not isinstance(value, (int, float))):
                self._warn_once(f"log-{name}", f"rec.log({name}=...) got "
                                f"{type(value).__name__}: pass a number")
            else:
                kept[name] = value
        late = LateScalars(list(kept.values()))  # tensors read one step late, as group 0's lr
        step = self._log_step
        if step is None:
            trained = any(kind == "forward" for kind, _ in self._phases)
            step = self._index if trained else max(self._index - 1, 0)
        for i, name in enumerate(kept):
            self._logged.append((step, name, functools.partial(late.value, i), now))

    def log_at(self, step: int, **scalars) -> None:
        """``log`` at an optimizer step already taken (the Trainer evaluates after its
        step ended)."""
        self._log_step = step
        try:
            self.log(**scalars)
        finally:
            self._log_step = None

    @contextmanager
    def step_timer(self):
        """Times one optimiser step: ``with rec.step_timer() as s: ...; s.loss = loss``."""
        if not self._started:
            self.start()
        step = TimedStep()
        self.begin_step()
        try:
            yield step
        except BaseException:
            self._guarded(self._stop_counter)  # the user's exception goes on, no mode left
            raise
        self.end_step(step.loss, step.tokens, step.grad_norm, step.lr)

    @never_raises
    def begin_step(self) -> None:
        self._begin_count_step()
        self._phases = []
        self._timer.start()
        self._alloc.start()

    @never_raises
    def end_step(self, loss=None, tokens=None, grad_norm=None, lr=None) -> None:
        self._record(self._timer.stop(), loss, tokens, grad_norm, lr)

    # --- what ran ----------------------------------------------------------------------

    @property
    def precision(self) -> str:
        if self._precision is None:
            self._precision = self._infer_precision()
        return self._precision

    def _weights(self) -> torch.dtype | None:
        param = _first_param(self.model)
        return param.dtype if param is not None else None

    def _infer_precision(self) -> str:
        counted = self._counted.by_peak_dtype if self._counted is not None else {}
        return what_ran.precision(self._weights() or torch.float32,
                                  self._autocast or what_ran.matmul_dtype(counted),
                                  self.scaler is not None and self.scaler.is_enabled(),
                                  self._tf32)

    def describe_recipe(self) -> str:
        if self._recipe_text:
            return cut(self._recipe_text, MAX_NAME)
        counted = self._counted.by_peak_dtype if self._counted is not None else {}
        base = base_optimizer(self.optimizer)
        return cut(what_ran.describe(
            "Trainer" if self.source == SOURCE_TRAINER else "user loop", self._weights(),
            self._autocast, what_ran.matmul_dtype(counted) if self._autocast is None else None,
            self.scaler is not None and self.scaler.is_enabled(),
            type(base or self.optimizer).__name__ if self.optimizer is not None else "none",
            self.recipe_details), MAX_NAME)
