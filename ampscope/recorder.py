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
import hashlib
import math
import numbers
import os
import socket
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
from ampscope import run_notes, what_ran
from ampscope.clip_norm import ClipNormKeeper
from ampscope.recorder_args import check_arguments, readable_step
from ampscope.step_args import learning_rates, lr_differs, token_count
from engine.core.config import PRECISIONS
from engine.core.events import (
    ErrorEvent,
    FlopsInfo,
    MemoryBreakdown,
    RunFinished,
    RunStarted,
    ScalarLog,
    StepSample,
    TrialFinished,
    TrialResult,
    TrialStarted,
    TrialSummary,
)
from engine.core.recipes import recipe as recipe_of
from engine.measure import flops as flops_mod
from engine.measure import inventory, memtrack, peak_choice
from engine.measure.device import probe
from engine.measure.environment import collect
from engine.measure.memory_breakdown import watched_memory
from engine.measure.monitor import Monitor
from engine.measure.peaks import PeakLookup
from engine.measure.peaks import mfu as mfu_of
from engine.measure.trackers import AllocatorTracker, LateScalars, ScalarReadback, StepTimer
from engine.record.bounded import MAX_NAME, MAX_TEXT, cut, traceback_text
from engine.record.journal import JournalWriter, journal_path
from engine.record.rank_journals import rank_journal_path
from engine.record.run_record import RunRecord
from engine.record.summary import summarise

SOURCE_LOOP = "user-loop"
SOURCE_TRAINER = "user-trainer"
COUNT_STEP = 1  # step 0 warms up (and compiles); FLOPs are counted over step 1
LAG = 1  # steps read back one step late: the GPU is never drained by a read
_SCALARS = ("loss", "grad_norm", "scale_before", "scale_after", "tokens", "lr")
RANKS_WAIT_S = 60.0  # rank 0's report waits this long for the other ranks' journals to end


def rank_and_world() -> tuple[int, int]:
    """This process's rank and the world size: the process group's once it exists, else
    torchrun's environment (RANK, WORLD_SIZE); (0, 1) outside torchrun."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    try:
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    except ValueError:
        return 0, 1


def shared_run_id(world: int) -> str:
    """A new run id, the same on every rank of one torchrun launch without a collective (a
    Recorder made on rank 0 alone must not wait for the others): derived from what torchrun
    gives all the ranks of the launch (its run id, rendezvous address and port, restart
    count), and, where the run id is torchrun's default "none", from the launcher's pid,
    which one node's ranks share."""
    if world <= 1:
        return uuid.uuid4().hex[:12]
    launch = os.environ.get("TORCHELASTIC_RUN_ID", "")
    parts = [launch, *(os.environ.get(k, "") for k in (
        "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"))]
    if launch in ("", "none"):
        parts.append(str(os.getppid()))
    return hashlib.sha1("/".join(parts).encode()).hexdigest()[:12]


def _strategy(model: torch.nn.Module) -> str:
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return "ddp"
    if type(model).__name__.startswith("FSDP"):  # fully_shard's class: FSDP<the model's>
        return "fsdp2"
    if type(model).__name__ == "FullyShardedDataParallel":
        return "fsdp"
    return "none (each rank trains its own model)"


def tf32_matmuls() -> bool:
    """Whether cuBLAS runs fp32 matmuls as TF32, read through the ``fp32_precision`` API.

    The legacy ``torch.backends.cuda.matmul.allow_tf32`` raises once the new API was set
    (transformers' ``TrainingArguments(tf32=True)`` sets ``torch.backends.fp32_precision``),
    while the new one also reflects the legacy flag and ``set_float32_matmul_precision``.
    """
    mode = torch.backends.cuda.matmul.fp32_precision
    if mode == "none":  # the matmul backend inherits the global setting
        mode = torch.backends.fp32_precision
    return mode == "tf32"


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
    scalars: object  # the ScalarReadback handle of the device tensors in _SCALARS
    host: dict  # the values of _SCALARS already on the host (None where on the device)
    seq_len: int | None
    allocated: int | None
    reserved: int | None
    time_s: float
    phases: list  # (kind, time mark) in order: see ampscope/phases.py


def _never_raises(method):
    """After construction AmpScope never breaks the user's loop: a failure of its own is
    warned about once and the loop goes on; the journal keeps what was recorded."""

    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            if method.__name__ in ("step", "end_step"):
                self._failed_steps += 1
            self._warn_once("internal", f"recording failed in {method.__name__}() "
                            f"({type(exc).__name__}: {exc}); your training goes on and the "
                            f"journal {self.journal_file} keeps what was recorded")
            return None

    return guarded


def _first_param(model: torch.nn.Module) -> torch.nn.Parameter | None:
    return next(iter(model.parameters()), None)


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


def _base_optimizer(optimizer):
    """The torch optimizer itself under wrappers (accelerate's AcceleratedOptimizer)."""
    while optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        optimizer = getattr(optimizer, "optimizer", None)
    inner = getattr(optimizer, "optimizer", None)
    return inner if isinstance(inner, torch.optim.Optimizer) else optimizer


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
    AmpScope's precision names, inferred when not given (the first training forward's
    autocast dtype, else the dtype most counted matmul FLOPs ran in; the weights' dtype;
    the scaler; TF32 through ``fp32_precision``). ``journal``: a new journal file
    (``runs/<run id>.jsonl`` in the data folder by default). ``optimizer`` may be None:
    no lr, optimizer state or measured grad norm then.
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
        check_arguments(optimizer, _base_optimizer(optimizer), scaler, monitor_hz)
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
        self._pending: list[_Pending] = []
        self._readback = ScalarReadback(self.device, width=len(_SCALARS), slots=LAG + 3)
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
        self._phases: list = []  # this step's time marks (see _Pending.phases)
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
        base = _base_optimizer(self.optimizer)
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

    def _open_journal(self) -> JournalWriter:
        """The journal; when it cannot be written (an unwritable data folder, a full disk)
        the run goes on without it, and the user is told once."""
        return JournalWriter(self.journal_file, on_failure=lambda reason: self._warn_once(
            "journal", f"{reason}: the run goes on without a journal"))

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

    @property
    def _tf32(self) -> bool:
        return self.device_info.kind == "cuda" and tf32_matmuls()

    def _begin_count_step(self) -> None:
        """Step 1: FLOPs counted (unless the Trainer scopes the counting) and memory watched;
        the watcher enters after the counter, so it leaves first (modes are a stack)."""
        if self._index != COUNT_STEP or self._finished:
            return
        if self._counter is None and not self.scoped_counting:
            self._start_counting()
        if self._watcher is None:
            watcher = memtrack.MemoryWatcher(self.device)
            watcher.track_training(self.model, _base_optimizer(self.optimizer))
            watcher.phase = "data"  # the batch is made before the first forward
            watcher.__enter__()
            self._watcher = watcher

    def _stop_watching(self, completed: bool) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is None:
            return
        base = _base_optimizer(self.optimizer)
        if base is not None:
            watcher.mark_optimizer_state(base)
        watcher.__exit__(None, None, None)
        if completed:
            self._measured = watcher.result()

    def _watch_phase(self, phase: str) -> None:
        if self._watcher is not None:
            self._watcher.phase = phase

    def _start_counting(self) -> None:
        """Hardware FLOPs: FlopCounterMode over the counting step, nothing else."""
        self._counter, self._by_dtype = flops_mod.counting_mode(self._tf32)
        self._counter.__enter__()

    def _pause_counting(self) -> None:
        """Leave the counter (its mode is popped), keeping what it counted so far."""
        ops, dtypes = self._tallies()
        self._counter.__exit__(None, None, None)
        self._counter = None
        ops.subtract(self._excluded[0])
        dtypes.subtract(self._excluded[1])
        self._excluded = (Counter(), Counter())
        self._count_ops.update(ops)
        self._count_dtypes.update(dtypes)

    def _stop_counting(self, completed: bool) -> None:
        if self._counter is not None:
            self._pause_counting()
        ops, dtypes = self._count_ops, self._count_dtypes
        self._count_ops, self._count_dtypes = Counter(), Counter()
        if completed and ops:
            self._counted = flops_mod.Counted(
                sum(ops.values()), {k: v for k, v in ops.items() if v > 0},
                {k: v for k, v in sorted(dtypes.items()) if v > 0})

    @contextmanager
    def counting(self):
        """Count the FLOPs of the code inside when it runs in the counting step; the
        Trainer callback wraps each ``training_step`` in it, so no exception can leave
        the counter's dispatch mode pushed."""
        if self._index != COUNT_STEP or self._counter is not None or self._finished:
            yield
            return
        self._start_counting()
        try:
            yield
        finally:
            self._pause_counting()

    def _tallies(self) -> tuple[Counter, Counter]:
        return (Counter({str(op): int(n) for op, n in self._counter.flop_counts["Global"].items()}),
                Counter(self._by_dtype))

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

    @_never_raises
    def _after_forward(self, module, args, output):
        if self._in_eval:
            self._in_eval = False
            if not self._in_block:
                self._phases.append(("eval_end", self._now()))
        if self._in_forward:
            self._in_forward = False
            self._phases.append(("forward_end", self._now()))
            self._watch_phase("backward")
            loss = phases_mod.loss_of(output)
            if loss is not None:  # its gradient is a backward's first: the backward begins
                loss.register_hook(self._backward_began)
        mark, self._eval_mark = self._eval_mark, None
        if mark is not None and self._counter is not None:
            # an evaluation forward inside the counting step: its FLOPs are not training's
            ops, dtypes = self._tallies()
            self._excluded[0].update(ops - mark[0])
            self._excluded[1].update(dtypes - mark[1])
        return None

    @_never_raises
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

    # --- steps -------------------------------------------------------------------------

    @_never_raises
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

    @_never_raises
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

    @_never_raises
    def begin_step(self) -> None:
        self._begin_count_step()
        self._phases = []
        self._timer.start()
        self._alloc.start()

    @_never_raises
    def end_step(self, loss=None, tokens=None, grad_norm=None, lr=None) -> None:
        self._record(self._timer.stop(), loss, tokens, grad_norm, lr)

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
            groups = _base_optimizer(self.optimizer)
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
                                       for k in _SCALARS])
        phases, self._phases = self._phases, []
        self._pending.append(_Pending(self._index, mark, scalars, host, self._seq_len,
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

    def _emit_step(self, p: _Pending) -> None:
        self._begin_run()
        step_ms = self._timer.sample(p.mark)
        device = dict(zip(_SCALARS, self._readback.read(p.scalars)))
        got = {k: _as_float(p.host[k]) if p.host[k] is not None else device[k]
               for k in _SCALARS}
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

    # --- the run's events --------------------------------------------------------------

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
        base = _base_optimizer(self.optimizer)
        return cut(what_ran.describe(
            "Trainer" if self.source == SOURCE_TRAINER else "user loop", self._weights(),
            self._autocast, what_ran.matmul_dtype(counted) if self._autocast is None else None,
            self.scaler is not None and self.scaler.is_enabled(),
            type(base or self.optimizer).__name__ if self.optimizer is not None else "none",
            self.recipe_details), MAX_NAME)

    def _begin_run(self) -> None:
        if self._run_begun:
            return
        config = {"model": self.name, "precisions": [self.precision],
                  "device": str(self.device), "source": self.source,
                  "recipe": self.describe_recipe()}
        if self.optimizer is not None:  # a report's config.optimizer is text when present
            config["optimizer"] = type(self.optimizer).__name__
        if self.world_size > 1:
            config.update(rank=self.rank, world_size=self.world_size,
                          local_rank=int(os.environ.get("LOCAL_RANK", self.rank)),
                          host=socket.gethostname(), pid=os.getpid(),
                          strategy=_strategy(self.model))
        first = [RunStarted(self.run_id, config, collect(self.device_info), self._started_s),
                 TrialStarted(self.precision, 0, 1, time.time())]
        # the run's start, then the monitor samples buffered before it, in one hold of the
        # lock: a sample the monitor thread emits meanwhile waits, never lands before them
        with self._lock:
            for event in [*first, *self._early]:
                self._journal.write(event)
                self.record.apply(event)
            self._early = []
            self._run_begun = True  # from here on events go to the journal, not the buffer

    @property
    def _peak(self) -> PeakLookup:
        """The datasheet peak MFU divides by, chosen as a profile trial's: a MIG slice's share
        of its GPU's, blended by the dtypes the counting step's FLOPs ran in (the recipe's
        dtype until that step is counted)."""
        counted = self._counted.by_peak_dtype if self._counted is not None else {}
        key = (self.precision, tuple(sorted(counted.items())))
        if self._peak_for is None or self._peak_for[0] != key:  # once, not at every step
            self._peak_for = (key, peak_choice.datasheet_peak(
                self.device_info, recipe_of(self.precision), counted))
        return self._peak_for[1]

    def _emit(self, event) -> None:
        with self._lock:
            if not self._run_begun:  # monitor samples before the first step
                self._early.append(event)
                return
            self._journal.write(event)
            self.record.apply(event)

    def finish(self, exc: BaseException | None = None) -> RunRecord:
        """End the run: the last steps, the trial's result, the report. Idempotent, and
        never raises: the user's own exception (``exc``) is what goes on."""
        if self._finished:
            return self.record
        self._finished = True
        atexit.unregister(self._at_exit)
        for release in (self._stop_counter, self._remove_hooks, self._unpatch_clip,
                         self._stop_monitor):
            self._guarded(release)  # each one, whatever the others did
        self._guarded(self._write_end, exc)
        if self.out is not None and self.rank != 0:
            print(f"ampscope: rank {self.rank} journaled to {self.journal_file}; rank 0 writes "
                  f"the report of all ranks to {self.out}", file=sys.stderr)
        elif self.out is not None:
            from engine.report.writer import write_report

            try:
                self.report_path = write_report(self._all_ranks(), self.out)
            except Exception as err:  # the out folder vanished, the disk filled up...
                reason = err.strerror if isinstance(err, OSError) and err.strerror else err
                self._warn_once("report", f"the report could not be written to {self.out} "
                                f"({reason}); the run is in its journal: python3 main.py "
                                f"report {self.journal_file} --out <report file>")
        return self.record

    def _all_ranks(self) -> RunRecord:
        """The run to report: this process's, or under torchrun every rank's journal
        merged, once they have all ended (or RANKS_WAIT_S has passed: what is there). A
        rank's journal exists from its Recorder's start, so a rank that records none (a
        loop that records on rank 0 alone) is not waited for."""
        if self.world_size == 1:
            return self.record
        from engine.record.journal import journal_entry, read_run
        from engine.record.rank_journals import rank_journals

        deadline = time.monotonic() + RANKS_WAIT_S
        while time.monotonic() < deadline:
            paths = rank_journals(self.journal_file)
            entries = [journal_entry(p) for p in paths]
            if all(e is not None and e.status != "running" for e in entries):
                break
            time.sleep(0.2)
        return read_run(self.journal_file)

    def _guarded(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as err:
            self._warn_once("internal", f"ending the run failed in {fn.__name__}() "
                            f"({type(err).__name__}: {err}); the journal {self.journal_file} "
                            "keeps what was recorded")

    def _stop_counter(self) -> None:
        self._stop_watching(completed=False)  # entered after the counter: leaves first
        if self._counter is not None:  # the run ended inside its counting step
            self._stop_counting(completed=False)

    def _remove_hooks(self) -> None:
        self._autostart.remove()
        if self._autocast_probe is not None:
            self._autocast_probe.remove()
        if self._backward_end is not None:
            self._backward_end.remove()
        hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook.remove()

    def _stop_monitor(self) -> None:
        if self._monitor is not None:
            self._monitor.stop()

    def _write_end(self, exc: BaseException | None) -> None:
        if self._journal is None:  # finished without a start: the run still gets a journal
            self._journal = self._open_journal()
        if not self._pending and not self.steps:
            print(f"ampscope: run {self.run_id} recorded no step: call rec.step() once per "
                  "optimizer step; the journal and report hold what is known", file=sys.stderr)
        try:
            self.flush()
            if self._flops is None:  # the run ended before a step after the warm-up
                self._flops = self._flops_info(None, "no step after the warm-up step was "
                                               "recorded")
        finally:
            self._begin_run()
            self._emit_logged(None)
            status, reason, trace = "ok", None, None
            if exc is not None:
                if isinstance(exc, KeyboardInterrupt):
                    status, reason = "cancelled", "stopped by Ctrl-C in the user's script"
                else:  # any length the user's message has, the journal reads back
                    status, reason = "error", cut(f"{type(exc).__name__}: {exc}", MAX_TEXT - 40)
                    trace = traceback_text(exc)
                    self._emit(ErrorEvent(f"the user's training raised {reason}",
                                          self.precision, time.time()))
            elif not self.steps:  # nothing measured is not an ok run
                status, reason = "error", (
                    "no step was recorded: call rec.step() once per optimizer step"
                    + (f" ({self._failed_steps} rec.step() calls failed: see the warning)"
                       if self._failed_steps else ""))
            result = self._result(status, reason, trace)
            self._emit(TrialFinished(result, time.time()))
            self._emit(RunFinished("ok" if status == "ok" else status, time.time()))
            self._journal.close()

    def _result(self, status: str, reason: str | None,
                traceback: str | None = None) -> TrialResult:
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
            notes=self._notes(),
            traceback=traceback,
        )

    def _notes(self) -> list[str]:
        return [*run_notes.notes(self._norm_methods, self.steps, self._lr_differed),
                *self.asked_notes]

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
        if self._measured is not None:
            return watched_memory(
                self._measured,
                f"engine.measure.memtrack over the user's step {COUNT_STEP} (untimed by the "
                "summary): every storage from allocation to release; the largest sum of live "
                "bytes", (peak_alloc, peak_res, covers),
                "categories are what was held at the peak of the watched step; the batch made "
                "by the loop's data loading counts as temporaries, weight copies are "
                "autocast's cast weights")
        common = dict(
            params_bytes=params_bytes, grads_bytes=grads, optimizer_bytes=opt,
            activations_bytes=None,
            activations_method="not measured: the run ended before its watched step "
                               f"(step {COUNT_STEP}) ended",
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
        tokens = [s.tokens for s in self.steps if not s.warmup]
        # one token count (and one model FLOPs) for every measured step: divided by the
        # median step time, as a profile trial's; where they vary, the steps' own medians
        same_tokens = bool(tokens) and all(tokens) and len(set(tokens)) == 1
        same_flops = len(self._measured_flops) == 1
        return summarise(
            self.steps, tokens_per_step=tokens[0] if same_tokens else None,
            model_flops_per_step=next(iter(self._measured_flops)) if same_flops else None,
            counted_flops_per_step=self._counted.total if self._counted is not None else None,
            peak=self._peak, memory=self._memory(),
            common_peak=peak_choice.common_peak(self.device_info),
            no_steps_reason=(f"no steps measured after the warm-up and FLOP-counting steps "
                             f"(0..{COUNT_STEP})"),
            no_flops_reason=self._flops.analytic_formula if self._flops else "no model FLOPs",
            # a user's loop is not paused for a matmul benchmark: profile trials measure it
            no_measured_peak_reason="MFU vs measured matmul peak is measured by main.py "
                                    "profile trials; a recorded loop divides by the datasheet "
                                    "peak only")
