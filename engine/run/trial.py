"""One trial: load the model at one precision, count, train for timed steps, summarise.

What was measured before a failure (OOM, an exception, a cancel) is kept: the trial
state accumulates as it goes, and the result is built from it whatever the ending.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.profiler import record_function

from engine.core.config import (
    AUTO,
    TORCHAO_STEP,
    WARMUP_RAISED_NOTE,
    RunConfig,
    base_precision,
    warmup_steps,
)
from engine.core.events import (
    FlopsInfo,
    GpmMetrics,
    HeldOutLoss,
    LogEvent,
    LostUpdates,
    MemoryBreakdown,
    ModuleInfo,
    ParamInfo,
    PhaseChanged,
    PredictedMemory,
    ProfiledStep,
    QuantError,
    StepSample,
    TrialResult,
    TrialSummary,
)
from engine.core.recipes import (
    Recipe,
    autocast_for,
    compiles,
    fp8_shape_reason,
    fp32_precision,
    library_sync_notes,
    mx_shape_reason,
    recipe,
    run_description,
)
from engine.measure import flops as flops_mod
from engine.measure import inventory, matmul_peak, memtrack, nvml, peak_choice, quant_error
from engine.measure.device import DeviceInfo
from engine.measure.gpm import GpmWindow
from engine.measure.kernel_workspace import with_kernel_workspace
from engine.measure.kernels import GRAD_NORM_RANGE, SCALER_RANGE, live_tensor_bytes, profile_step
from engine.measure.lost_updates import measure_trial as measure_lost_updates
from engine.measure.memory_breakdown import watched_memory
from engine.measure.peaks import PeakLookup, over_peak
from engine.measure.peaks import mfu as mfu_of
from engine.measure.step_basis import against_measured_steps
from engine.measure.trackers import AllocatorTracker, ScalarReadback, StepTimer
from engine.measure.untouched import untouched
from engine.models import heldout as held_out
from engine.models.load import (
    dims,
    float8_scaling,
    load_config,
    load_model,
    mx_scaling,
    resolve_source,
)
from engine.models.memory_model import predict_memory, with_errors
from engine.models.memory_model import shape_of as memory_shape
from engine.models.training_data import training_batches
from engine.record.bounded import traceback_text
from engine.record.summary import summarise
from engine.run import fp8_auto
from engine.run.step_undo import StepUndo
from engine.run.timed_memory import timed_peak

BATCH_POOL = 8  # distinct batches cycled through the steps
# why a round before an interleaved precision's last has no held-out loss or lost updates:
# only seen where the run was stopped between its rounds
LATER_ROUND = ("not measured: the precision's last round measures it, and the run was stopped "
               "before that round")


class _Fp16GradScaler(torch.amp.GradScaler):
    """GradScaler that also unscales fp16 gradients (pure-fp16 recipe).

    Stock GradScaler refuses fp16 gradients because unscaling them in fp16 can
    underflow; the pure fp16 recipe exists to show exactly that cost.
    """

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
        return super()._unscale_grads_(optimizer, inv_scale, found_inf, True)


def fp32_norm(grads: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The gradients' global L2 norm as a device tensor, summed in fp32: in bf16 the sum of
    squares loses about 0.5%. One foreach norm over every gradient, then one norm of those:
    a norm per parameter cost GPT-2 149 kernel launches a step (5-7% of an H200 step)."""
    if not grads:
        return torch.zeros((), device=device)
    if _foreach_norm_takes_dtype():
        parts = torch._foreach_norm(grads, 2, dtype=torch.float32)
    else:  # a torch whose foreach norm has no output dtype: one norm per tensor
        parts = [torch.linalg.vector_norm(g, dtype=torch.float32) for g in grads]
    return torch.linalg.vector_norm(torch.stack(parts))


@functools.cache
def _foreach_norm_takes_dtype() -> bool:
    """Whether this torch's ``_foreach_norm`` computes in a given dtype (its schema says;
    torch.nn.utils.get_total_norm has no dtype, and a bf16 norm per tensor would round)."""
    try:
        schema = torch.ops.aten._foreach_norm.Scalar._schema
    except (AttributeError, RuntimeError):
        return False
    return any(arg.name == "dtype" for arg in schema.arguments)


def adam_eps(params: list) -> float:
    """Adam's epsilon, raised where the default would round to zero in a trainable dtype.

    In pure fp16, 1e-8 becomes 0, and a parameter whose gradient was 0 so far then
    divides 0 by 0: NaN weights after one step. The smallest normal value of the least
    precise trainable dtype is the least epsilon that survives. Only the trained weights
    matter: a frozen fp16 base (int8, nf4) with fp32 LoRA adapters keeps 1e-8.
    """
    default = 1e-8
    dtype = trainable_dtype(params)
    if dtype is not None and torch.tensor(default, dtype=dtype).item() == 0.0:
        return float(torch.finfo(dtype).tiny)
    return default


def trainable_dtype(params: list) -> torch.dtype | None:
    """The floating dtype of ``params`` with the smallest normal range (None if none)."""
    floats = {p.dtype for p in params if p.dtype.is_floating_point}
    return max(floats, key=lambda d: torch.finfo(d).tiny, default=None)


def make_optimizer(name: str, params: list, lr: float, eps: float = 1e-8,
                   fused: bool = False):
    """``fused`` (CUDA): one kernel per step, and a GradScaler hands it the inf check as a
    tensor; the default foreach AdamW makes ``GradScaler.step`` call ``.item()`` mid-step,
    which would slow the scaled (fp16) recipes only."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, fused=fused or None)
    if name == "adamw8bit":
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(params, lr=lr, eps=eps)
    if name in _TORCHAO_OPTIMIZERS:
        import torchao.optim

        # torchao's AdamWs default to weight_decay=1e-2 as torch's AdamW does
        return getattr(torchao.optim, _TORCHAO_OPTIMIZERS[name])(params, lr=lr, eps=eps)
    if name == "adamw-bf16-sr":
        return _bf16_state_adamw()(params, lr=lr, eps=eps, bf16_stochastic_round=True)
    return torch.optim.AdamW(params, lr=lr, eps=eps, fused=fused or None)


_TORCHAO_OPTIMIZERS = {"adamw8bit-ao": "AdamW8bit", "adamw4bit": "AdamW4bit",
                       "adamw-fp8": "AdamWFp8"}


def _bf16_state_adamw():
    """torchao's ``_AdamW`` keeps m and v in the weight's dtype (fp32 under AMP); this one
    keeps them in bf16 for every weight. Its step computes in fp32 and stochastically rounds
    bf16 weights (torchao 0.18 ``single_param_adam``); the state is rounded to nearest."""
    from torchao.optim import _AdamW

    class AdamWBf16State(_AdamW):
        def _new_buffer(self, p, signed):
            return torch.zeros_like(p, dtype=torch.bfloat16)

    return AdamWBf16State


def optimizer_reason(name: str, device_type: str) -> str | None:
    """Why a trial's optimiser cannot run on this device, or None. torchao's optimisers
    compile every step with torch.compile(fullgraph=True): inductor needs a C++ compiler
    on the CPU and Triton on a GPU."""
    if name not in TORCHAO_STEP:
        return None
    try:
        import torchao.optim  # noqa: F401
    except Exception as exc:
        return f"torchao's optimizers cannot load ({type(exc).__name__}: {exc})"
    if device_type == "cuda":
        from torch.utils._triton import has_triton

        return None if has_triton() else (
            f"{name} compiles its step with torch.compile, which needs Triton on a GPU: "
            "pip install triton")
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        get_cpp_compiler()
    except Exception as exc:
        return (f"{name} compiles its step with torch.compile, which needs a C++ compiler on "
                f"the CPU ({exc}): install g++")
    return None


def make_scaler(rec: Recipe, device: torch.device, config: RunConfig):
    if not rec.use_scaler:
        return None
    cls = _Fp16GradScaler if rec.weight_dtype == torch.float16 else torch.amp.GradScaler
    return cls(device.type, init_scale=config.init_scale, growth_interval=config.growth_interval)


@dataclass
class _State:
    """What a trial has measured so far."""

    config: RunConfig
    rec: Recipe
    device_info: DeviceInfo
    started_s: float = field(default_factory=time.time)
    param_count: int = 0
    trainable_params: int = 0
    footprint_bytes: int | None = None
    footprint_note: str = ""
    dtype_map: list[ParamInfo] = field(default_factory=list)
    module_tree: list[ModuleInfo] = field(default_factory=list)
    memory: MemoryBreakdown | None = None
    memory_at_rest: bool = False  # ``memory`` is what a stopped trial held, not a peak
    predicted: PredictedMemory | None = None
    flops: FlopsInfo | None = None
    steps: list[StepSample] = field(default_factory=list)
    peak: object = None  # the datasheet peak (PeakLookup)
    measured_peak: PeakLookup | None = None  # this machine's measured matmul peak
    common_peak: PeakLookup | None = None  # one denominator for every recipe on the device
    profiled: ProfiledStep | None = None
    profiled_reason: str | None = None
    gpm: GpmMetrics | None = None
    compiled: bool | None = None  # None until the trial decided (it may never run)
    notes: list[str] = field(default_factory=list)
    nvml_baseline_bytes: int | None = None  # device-wide used memory before the trial
    energy: tuple[float | None, int, str] = (None, 0, "not measured")  # joules, steps, how
    round_index: int = 0  # interleaved rounds: steps of earlier rounds come first in ``steps``
    step_offset: int = 0
    distinct_batches: int | None = None
    lora: dict | None = None
    quant_error: QuantError | None = None
    quant_error_reason: str | None = "not measured: the trial ended before its first step"
    heldout_before: float | None = None
    profiled_steps_run: int = 0  # optimiser steps the profiled step took
    heldout: HeldOutLoss | None = None
    heldout_reason: str = "not measured: the trial ended before its untimed tail"
    lost_updates: LostUpdates | None = None
    lost_updates_reason: str = "not measured: the trial ended before its untimed tail"

    memory_timeline: object = None  # the memory step's MemoryTimeline
    fp8_auto: dict | None = None  # an ":auto" recipe's layers (engine/run/fp8_auto.py)

    def phase(self, emit, phase: str) -> None:
        emit(PhaseChanged(self.rec.precision, phase, time.time(), self.round_index))

    @property
    def optimizer(self) -> str:
        """This trial's optimiser: its label's "+optim", else the run's --optimizer."""
        return self.rec.optimizer or self.config.optimizer

    def result(self, status: str, reason: str | None,
               traceback: str | None = None) -> TrialResult:
        verdict = self.device_info.verdict(self.rec.precision)
        return TrialResult(
            precision=self.rec.precision,
            status=status,
            reason=reason,
            recipe=run_description(self.rec, self.device_info.kind, self.optimizer,
                                   self.compiled),
            notes=list(self.notes),
            device=self.device_info.describe(),
            param_count=self.param_count,
            trainable_params=self.trainable_params,
            load_footprint_bytes=self.footprint_bytes,
            footprint_note=self.footprint_note,
            memory=self.memory,
            predicted_memory=self.predicted,
            dtype_map=self.dtype_map,
            module_tree=self.module_tree,
            flops=self.flops,
            steps=list(self.steps),
            summary=None if status == "unsupported" else self._summary(),
            lora=self.lora,
            started_s=self.started_s,
            finished_s=time.time(),
            profiled_step=self.profiled,
            gpm=self.gpm,
            profiled_step_reason=None if self.profiled else (
                self.profiled_reason or "the trial ended before its measured steps finished"),
            support=verdict.support if verdict else None,
            support_reason=verdict.reason if verdict else None,
            quant_error=self.quant_error,
            quant_error_reason=None if self.quant_error else self.quant_error_reason,
            compiled=self.compiled,
            lost_updates=self.lost_updates,
            lost_updates_reason=None if self.lost_updates else self.lost_updates_reason,
            heldout_loss=self.heldout,
            heldout_loss_reason=None if self.heldout else self.heldout_reason,

            memory_timeline=self.memory_timeline,
            traceback=traceback,
            fp8_auto=self.fp8_auto,
        )

    def _summary(self) -> TrialSummary:
        flops = self.flops
        timed = timed_peak(self.memory, self.compiled)  # the compiled steps' peak, not eager's
        return summarise(
            self.steps, tokens_per_step=self.config.tokens_per_step,
            model_flops_per_step=flops.analytic_per_step if flops else None,
            counted_flops_per_step=flops.counted_per_step if flops else None,
            peak=self.peak, measured_peak=self.measured_peak, common_peak=self.common_peak,
            # bytes held at rest by a stopped trial are kept in ``memory``, never as its peak
            memory=None if self.memory_at_rest else timed[0],
            memory_reason=("not measured: the run was stopped before the watched step"
                           if self.memory_at_rest else timed[1] or "not measured"),
            energy=self.energy, distinct_batches=self.distinct_batches)


def run_trial(
    config: RunConfig,
    precision: str,
    device_info: DeviceInfo,
    emit: Callable[[object], None],
    cancelled: Callable[[], bool],
    prior_steps: tuple[StepSample, ...] = (),
    round_index: int = 0,
    prior_flops: FlopsInfo | None = None,
) -> TrialResult:
    """Measure one precision. Never raises: failures become the trial's status.

    ``prior_steps`` are the steps of this precision's earlier rounds when precisions are
    interleaved (engine/run/rounds.py): they open the result's steps, new steps are numbered
    after them, and the summary covers them all. ``prior_flops``: the FLOPs the first round
    counted, which a later round takes instead of counting them again (its uncounted step
    would cost as much as a measured one).
    """
    rec = recipe(precision)
    state = _State(config, rec, device_info, steps=list(prior_steps), round_index=round_index,
                   step_offset=len(prior_steps), flops=prior_flops)
    reason = (device_info.unsupported_reason(base_precision(precision))
              or optimizer_reason(state.optimizer, device_info.kind)
              or _shape_reason(config, rec, device_info.verdict(precision))
              or (fp8_auto.card_reason(precision, config.payoff_card, device_info.kind,
                                       device_info.name) if rec.keep_high == AUTO else None))
    if reason:
        return state.result("unsupported", reason)
    # before this trial touches the GPU: the fallback when NVML shows no pid of ours
    state.nvml_baseline_bytes = nvml.used_bytes(device_info.nvml_handle())
    try:
        with device_info.device_context(), fp32_precision(rec):
            stopped = _measure(state, emit, cancelled)
    except Exception as exc:
        return state.result(*failure(exc), traceback_text(exc))
    finally:
        if device_info.kind == "cuda":
            try:  # after a sticky CUDA error this raises too: the result must still go out
                torch.cuda.empty_cache()
            except Exception:  # noqa: S110
                pass
    if stopped:
        measured = sum(1 for s in state.steps if not s.warmup)
        return state.result("cancelled", f"stopped by the user after {measured} measured steps")
    return state.result("ok", None)


HOST_OOM_ADVICE = ("try a smaller batch, sequence or model, or raise the memory limit "
                   "(ulimit -v, the container's memory limit)")


def failure(exc: Exception) -> tuple[str, str]:
    """A trial's status and reason for the exception that ended it."""
    text = str(exc)
    first = text.splitlines()[0] if text else type(exc).__name__
    if isinstance(exc, torch.OutOfMemoryError) or "CUBLAS_STATUS_ALLOC_FAILED" in text:
        return "oom", f"out of GPU memory: {first}"
    if isinstance(exc, MemoryError) or "can't allocate memory" in text:
        return "oom", f"out of host memory ({first}): {HOST_OOM_ADVICE}"
    return "error", f"{type(exc).__name__}: {text}"


def _shape_reason(config: RunConfig, rec: Recipe, verdict) -> str | None:
    """Shapes float8 or block-scaled training cannot run, found before anything loads.
    Emulated NVFP4 takes any shape: it pads the tokens and leaves in bf16 the layers that
    are not whole 16-blocks (the trial's notes count the converted ones)."""
    emulated_nvfp4 = rec.mx == "nvfp4" and verdict is not None and verdict.support == "emulated"
    if not (rec.fp8 or rec.mx) or emulated_nvfp4:
        return None
    try:
        model_config, _ = load_config(resolve_source(config.model), config.trust_remote_code)
    except Exception:  # loading the model reports it, as the trial's error
        return None
    tokens, hidden = config.batch_size * config.seq_len, dims(model_config)["hidden"]
    if rec.mx:
        return mx_shape_reason(rec, tokens, hidden)
    return fp8_shape_reason(tokens, hidden)


def _compute_dtype(rec: Recipe) -> str:
    """The peak-table dtype a recipe's unconverted matmul layers multiply in."""
    key = flops_mod.PEAK_KEYS[rec.autocast_dtype or rec.weight_dtype]
    return "tf32" if rec.tf32 else key


def _measure(state: _State, emit, cancelled) -> bool:
    """Fill ``state``; returns True when the run was cancelled part-way."""
    config, rec, info = state.config, state.rec, state.device_info
    device = info.torch_device

    def log(msg: str, level: str = "info") -> None:
        emit(LogEvent(level, msg, rec.precision, time.time()))

    if matmul_peak.cached(info) is None:
        log(f"measuring this machine's matmul peak ({', '.join(matmul_peak.DTYPES)}; once per "
            f"machine, cached in {matmul_peak.cache_path()})")
    # before the model: the GPU's memory is free for it, and the seed below is untouched
    rates = matmul_peak.for_device(info)
    # an ':auto' recipe's layers, from a skeleton built before the seed below is set
    auto = (fp8_auto.choose(config, rec.precision, info.name, info.kind)
            if rec.keep_high == AUTO else None)
    torch.manual_seed(config.seed)

    loaded = load_model(config.model, rec, device, config.seed, config.trust_remote_code,
                        config.lora_r, config.grad_checkpointing,
                        initial_weights=config.initial_weights,
                        keep_bf16=auto.keep_bf16 if auto else None)
    model = loaded.model
    if auto:  # which layers ran float8, read from the converted model
        state.fp8_auto = fp8_auto.summary(auto, model)
        state.notes.append(fp8_auto.note(rec.precision, state.fp8_auto))
    state.footprint_bytes, state.footprint_note = loaded.footprint_bytes, loaded.footprint_note
    state.dtype_map = inventory.dtype_map(model)
    state.module_tree = inventory.module_tree(model, high_dtype=_compute_dtype(rec))
    state.param_count, state.trainable_params = inventory.count_params(model)
    state.lora = loaded.lora
    if rec.fp8 and not (auto and not state.fp8_auto["converted"]):  # else said above
        state.notes.append(float8_scaling(model) or "no Linear layer had float8-compatible "
                           "shapes: every matmul ran in bf16")
    if rec.mx:
        state.notes.append(mx_scaling(model) or "no Linear layer had block-scaled-compatible "
                           "shapes: every matmul ran in bf16")
    mib = loaded.footprint_bytes / 2**20
    log(f"loaded {config.model}: {state.param_count:,} parameters "
        f"({state.trainable_params:,} trainable), footprint {mib:.2f} MiB")
    if cancelled():
        return True

    params = [p for p in model.parameters() if p.requires_grad]
    eps = adam_eps(params)
    optimizer = make_optimizer(state.optimizer, params, config.lr, eps,
                               fused=info.kind == "cuda")
    if eps != 1e-8 and state.optimizer != "sgd":
        dtype = str(trainable_dtype(params)).removeprefix("torch.")
        log(f"Adam epsilon raised from 1e-8 to {eps:.3g}: 1e-8 rounds to 0 in {dtype} (the "
            "trained weights' dtype) and 0/0 would make NaN weights", "warning")
    scaler = make_scaler(rec, device, config)
    total = warmup_steps(config.warmup) + config.steps
    if config.warmup < warmup_steps(config.warmup):
        state.notes.append(WARMUP_RAISED_NOTE)
    batches = training_batches(loaded, config, min(BATCH_POOL, total * config.grad_accum),
                               device)
    state.distinct_batches = len(batches)

    verdict = info.verdict(rec.precision)
    state.compiled = compiles(rec, config.compile, config.warmup, verdict)
    if verdict is not None and verdict.support == "emulated":
        state.notes.append(f"emulated: {verdict.reason}")
    state.phase(emit, "probes")
    count_first = None  # how the first warm-up step runs: counted when no probe counted
    # a step that compiles (the model, or torchao's optimizer step) is counted apart, eagerly:
    # dynamo does not trace under FlopCounterMode
    if state.flops is None and (state.compiled or state.optimizer in TORCHAO_STEP):
        _probe(state, loaded, batches[0])
    elif state.flops is None:
        count_first = functools.partial(_counted_step, state, loaded, rates, optimizer=optimizer,
                                        scaler=scaler)
    _quant_error(state, model, batches[0], device)
    held = None
    if config.last_round:  # the held-out loss an earlier round measured would be replaced
        held = held_out.batches(loaded, config, device)
        with untouched(model, device):
            state.heldout_before = held_out.loss(model, rec, held, device)
    if state.flops is not None:
        _set_peaks(state, rates)
    state.common_peak = peak_choice.common_peak(info)
    state.notes.extend(library_sync_notes(rec, loaded.task, state.compiled, state.optimizer,
                                          device.type))
    if state.compiled:
        # as a fresh process would: an inline trial (fit's probes) must not reuse the graphs,
        # guards and dynamic-shape decisions of the trial before it, nor count toward its
        # recompile limit (past it dynamo runs the model eagerly without a word)
        torch._dynamo.reset()
        compiles_before = _compile_counts()
    step_model = torch.compile(model) if state.compiled else model
    alloc = AllocatorTracker(device)
    gpm = GpmWindow(info)
    stopped = _train_steps(state, step_model, params, optimizer, scaler, batches, alloc, emit,
                           cancelled, gpm, count_first)
    state.gpm = gpm.stop()
    if matmul_peak.beaten_by(state.steps[state.step_offset:]):
        with untouched(model, device):  # its random matrices draw from the RNG
            _remeasure_peak(state, log)
    if state.compiled:
        note, breaks = _compile_note(compiles_before, _compile_counts())
        state.notes.append(note)
        if breaks:
            log(note, "warning")
    if stopped or not config.last_round:
        # a cancel ends the trial now: no further untimed step to watch memory; a round before
        # the last keeps what it holds, as a run stopped before its last round would show
        state.memory = _memory_at_rest(model, optimizer, batches[0], device)
        state.memory_at_rest = True
        if stopped:
            return True
        state.heldout_reason = state.lost_updates_reason = LATER_ROUND
        _profiled_tail(state, step_model, params, optimizer, scaler, batches, log, cancelled,
                       emit)
        return False
    state.phase(emit, "memory step")
    try:
        measured = tracked_step(config, rec, device, model, optimizer, scaler, batches)
    except Exception as exc:
        if not _eager_oom_of_compiled(state, exc):
            raise
        optimizer.zero_grad(set_to_none=True)
        state.memory = _compiled_peak_only(model, optimizer, batches[0], alloc, device, exc)
        log(state.memory.notes, "warning")
    else:
        state.memory = _memory(measured, alloc, info, state.compiled, state.nvml_baseline_bytes)
        state.memory_timeline = measured.timeline
        if rec.quant and info.kind != "cuda":
            state.notes.append(BNB_TEMPORARIES_NOTE)
        if state.optimizer in TORCHAO_STEP:
            state.notes.append(f"{state.optimizer}: the step that watches memory runs the "
                               "optimizer eagerly (torch.compile refuses to trace under the "
                               "memory watcher), so its scratch bytes are eager ones; the "
                               "optimizer state is the same")
    shape = memory_shape(model, getattr(model, "config", loaded.config), dims(loaded.config))
    predicted = predict_memory(rec, state.optimizer, shape, config.batch_size, config.seq_len,
                               config.grad_checkpointing, device.type)
    state.predicted = with_errors(predicted, state.memory)
    _profiled_tail(state, step_model, params, optimizer, scaler, batches, log, cancelled, emit)
    if not cancelled():
        _untimed_tail(state, model, params, optimizer, scaler, batches[0], held)
    return False


def _profiled_tail(state: _State, step_model, params, optimizer, scaler, batches, log,
                   cancelled, emit) -> None:
    if not state.config.profile_step:
        state.profiled_reason = "turned off (--no-kernel-profile)"
    elif not cancelled():
        state.phase(emit, "profiled step")
        _profiled_step(state, step_model, params, optimizer, scaler, batches, log)


def _untimed_tail(state: _State, model, params, optimizer, scaler, batch, held) -> None:
    """After every step: the held-out loss, then the step that counts lost updates (it puts
    the weights back). A failure here costs only these figures."""
    config, device = state.config, state.device_info.torch_device
    try:
        with untouched(model, device):
            after = held_out.loss(model, state.rec, held, device)
        # warm-up, measured, the memory step, and every step the profiler ran (its shapes
        # step, a memory snapshot's, and its schedule's), failed or not
        steps = (warmup_steps(config.warmup) + config.steps + 1
                 + state.profiled_steps_run)
        state.heldout = held_out.result(state.heldout_before, after, held, steps,
                                         config.data)
    except Exception as exc:
        state.heldout_reason = f"the held-out forward failed: {type(exc).__name__}: {exc}"
    try:
        with untouched(model, device):
            state.lost_updates, reason = measure_lost_updates(
                model, params, optimizer, state.optimizer, scaler, state.rec, batch, device,
                config.lr)
        state.lost_updates_reason = reason or ""
    except Exception as exc:
        optimizer.zero_grad(set_to_none=True)
        state.lost_updates_reason = (f"the lost-update step failed: {type(exc).__name__}: "
                                     f"{exc}")
    _release(device)


def _remeasure_peak(state: _State, log) -> None:
    """A step beat the cached matmul peak, so it was measured low (under load): measure again,
    keep the best, and recompute this trial's MFU against it; a figure still above 100% is
    n/a (engine.measure.peaks.over_peak)."""
    best = max(s.mfu_measured for s in state.steps[state.step_offset:] if s.mfu_measured)
    why = f"a {state.rec.precision} step reached {best:.0%} of it"
    log(f"this run beat the measured matmul peak ({why}): measuring it again", "warning")
    rates = matmul_peak.remeasure(state.device_info, why)
    state.measured_peak = peak_choice.measured_peak(rates, state.rec, state.flops.by_peak_dtype)

    def again(s: StepSample) -> StepSample:
        mfu = mfu_of(s.tflops * 1e12, state.measured_peak) if s.tflops is not None else None
        return dataclasses.replace(s, mfu_measured=None if over_peak(mfu) else mfu)

    state.steps[state.step_offset:] = [again(s) for s in state.steps[state.step_offset:]]


def _compile_counts() -> tuple[int, dict]:
    """torch._dynamo's running totals: graphs compiled, and graph breaks by reason."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"], dict(counters["graph_break"])


def _compile_note(before: tuple[int, dict], after: tuple[int, dict]) -> tuple[str, int]:
    """What torch.compile did for this trial's steps: a graph break leaves the code around
    it to run eagerly, which the step times would otherwise hide."""
    graphs = after[0] - before[0]
    # dynamo notes a break each time it traces past it (again after a restart), so the
    # distinct reasons are counted, not the notes
    breaks = [reason for reason, n in after[1].items() if n > before[1].get(reason, 0)]
    count = len(breaks)
    text = (f"torch.compile: {graphs} graph{'s' if graphs != 1 else ''} compiled, "
            f"graph breaks for {count} reason{'s' if count != 1 else ''}")
    if breaks:
        first = breaks[0].strip().splitlines()[0]
        text += f" (the code between graphs ran eagerly; first: {first})"
    return text, count


def _profiled_step(state: _State, model, params, optimizer, scaler, batches, log) -> None:
    """One extra step under torch.profiler after the measured ones; it counts for nothing
    else. A failure here costs only the kernel table, never the trial."""
    config, rec = state.config, state.rec
    device = state.device_info.torch_device
    i = warmup_steps(config.warmup) + config.steps
    trace = snapshot = None
    if config.trace_dir:
        os.makedirs(config.trace_dir, exist_ok=True)
        stem = rec.precision.replace(":", "_")  # "fp8:keep-ends": no ':' in Windows names
        trace = os.path.join(config.trace_dir, f"{stem}.trace.json")
        if device.type == "cuda":
            snapshot = os.path.join(config.trace_dir, f"{stem}.memory.pickle")
    live = live_tensor_bytes(list(model.parameters()), list(model.buffers()),
                             memtrack.quant_state_tensors(model),
                             list(optimizer.state.values()), batches)
    def step():  # each one is an optimiser step: the held-out loss after counts them
        state.profiled_steps_run += 1
        _step(config, rec, device, model, params, optimizer, scaler, batches, i)

    try:
        state.profiled = with_kernel_workspace(against_measured_steps(
            profile_step(step, device, live, trace, snapshot), state.steps), state.memory,
            device.type == "cpu" and not state.compiled and state.memory_timeline is not None)
    except Exception as exc:
        state.profiled_reason = f"the profiled step failed: {type(exc).__name__}: {exc}"
        log(state.profiled_reason, "warning")


def _probe(state: _State, loaded, batch: dict) -> None:
    """One uncounted forward+backward under FlopCounterMode, before the steps of a trial
    that compiles (the model, or torchao's optimizer step): hardware and model FLOPs."""
    config, rec, model = state.config, state.rec, loaded.model
    device = state.device_info.torch_device

    def step():
        with autocast_for(rec, device):
            loss = model(**batch).loss
        loss.backward()

    try:
        with untouched(model, device):
            counted = flops_mod.count_flops(step, tf32=rec.tf32 and device.type == "cuda")
        counted_method = ("torch.utils.flop_counter.FlopCounterMode over one forward+backward, "
                          f"x {config.grad_accum} micro-batches")
    except Exception as exc:  # some quantised kernels refuse the counting mode
        model.zero_grad(set_to_none=True)
        counted = None
        if _eager_oom_of_compiled(state, exc):
            _release(device)
            counted_method = (f"n/a: the eager counting step ran out of memory "
                              f"({failure(exc)[1]}); the compiled steps hold less, so the "
                              "trial went on without hardware FLOPs")
        else:
            with untouched(model, device):
                step()
            counted_method = f"FlopCounterMode failed: {type(exc).__name__}: {exc}"
    model.zero_grad(set_to_none=True)
    _set_flops(state, loaded, counted, config.grad_accum, counted_method)


def _counted_step(state: _State, loaded, rates, step, optimizer, scaler):
    """The first warm-up step under FlopCounterMode (an eager trial's FLOPs cost no step of
    their own), then its FLOPs and the peaks its steps are divided by. Returns the step's
    outputs."""
    rec, device = state.rec, state.device_info.torch_device
    outputs = []
    undo = StepUndo(optimizer, scaler, device)
    try:
        counted = flops_mod.count_flops(lambda: outputs.append(step()),
                                        tf32=rec.tf32 and device.type == "cuda")
        counted_method = ("torch.utils.flop_counter.FlopCounterMode over the first warm-up "
                          f"step: forward and backward of its {state.config.grad_accum} "
                          "micro-batch(es) and the optimizer's step")
    except Exception as exc:  # some quantised kernels refuse the counting mode
        undo.restore()  # the attempt may have stopped anywhere: the rerun is a clean step
        if undo.began_update:  # weights may be half updated: a rerun would step on top
            raise
        counted, outputs = None, [step()]
        counted_method = f"FlopCounterMode failed: {type(exc).__name__}: {exc}"
    finally:
        undo.close()
    _set_flops(state, loaded, counted, 1, counted_method)
    _set_peaks(state, rates)
    return outputs[0]


def _set_flops(state: _State, loaded, counted, accum: int, counted_method: str) -> None:
    """``state.flops``: ``counted`` (x ``accum`` where it covered one micro-batch) beside
    the analytic model FLOPs."""
    config = state.config
    mm_total, mm_trainable = flops_mod.matmul_param_counts(loaded.model)
    analytic, formula = flops_mod.model_flops(
        tokens=config.tokens_per_step, matmul_params=mm_total,
        trainable_matmul_params=mm_trainable,
        attention=flops_mod.attention_stacks(dims(loaded.config), config.seq_len),
    )
    state.flops = FlopsInfo(
        counted_per_step=counted.total * accum if counted else None,
        counted_method=counted_method,
        analytic_per_step=analytic,
        analytic_formula=formula,
        by_op={k: v * accum for k, v in counted.by_op.items()} if counted else {},
        by_peak_dtype={k: v * accum for k, v in counted.by_peak_dtype.items()} if counted else {},
        model_convention=flops_mod.MODEL_FLOPS_CONVENTION,
        hardware_convention=flops_mod.HARDWARE_FLOPS_CONVENTION,
    )


def _set_peaks(state: _State, rates) -> None:
    """The datasheet and measured peaks for the dtypes this trial's FLOPs ran in."""
    by_dtype = state.flops.by_peak_dtype
    state.peak = peak_choice.datasheet_peak(state.device_info, state.rec, by_dtype)
    state.measured_peak = peak_choice.measured_peak(rates, state.rec, by_dtype)


def _quant_error(state: _State, model, batch: dict, device: torch.device) -> None:
    """Each matmul layer's SQNR on one uncounted forward; a failure costs only this figure."""
    reason = quant_error.reason_none(state.rec)
    if reason is None and not state.config.quant_error:
        reason = "turned off (--no-quant-error)"
    if reason is not None:
        state.quant_error_reason = reason
        return
    try:
        with untouched(model, device):
            state.quant_error = quant_error.measure(model, state.rec, batch, device)
    except Exception as exc:
        state.quant_error_reason = f"the SQNR forward failed: {type(exc).__name__}: {exc}"
    _release(device)


def _eager_oom_of_compiled(state: _State, exc: Exception) -> bool:
    """An OOM in one of the eager steps (FLOP counting, memory watching) of a compiled
    trial: eager kernels keep intermediates that compiled ones fuse away, so it says
    nothing about whether the compiled steps fit (fit's probes must not read it so)."""
    return bool(state.compiled) and failure(exc)[0] == "oom"


def _release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _compiled_peak_only(model, optimizer, batch, alloc: AllocatorTracker, device,
                        exc: Exception) -> MemoryBreakdown:
    """Memory of a compiled trial whose eager watched step ran out of memory: what is held
    at rest, and the allocator's peak over the compiled measured steps (GPU only)."""
    _release(device)
    rest = _memory_at_rest(model, optimizer, batch, device)
    peak_alloc, peak_res, covers = alloc.stop()
    why = (f"the eager step that watches memory by category ran out of memory "
           f"({failure(exc)[1]}); the compiled steps did not")
    if peak_alloc is None:
        return dataclasses.replace(rest, activations_method=f"not measured: {why}",
                                   notes=f"{why}: only what is held at rest was measured")
    return dataclasses.replace(
        rest, peak_allocated_bytes=peak_alloc, peak_reserved_bytes=peak_res,
        total_bytes=peak_alloc, total_method=f"torch.cuda.max_memory_allocated {covers}",
        activations_method=f"not measured: {why}",
        notes=f"{why}: the peak is the allocator's over the compiled steps; categories are "
              "what is held at rest")


def _step(config: RunConfig, rec: Recipe, device: torch.device, model, params, optimizer,
          scaler, batches, i: int):
    """One optimiser step; the named ranges let the profiled step attribute its time."""
    loss_sum = torch.zeros((), device=device)
    for micro in range(config.grad_accum):
        batch = batches[(i * config.grad_accum + micro) % len(batches)]
        with autocast_for(rec, device):
            loss = model(**batch).loss / config.grad_accum
        (scaler.scale(loss) if scaler else loss).backward()
        loss_sum += loss.detach().float()
    scale_before = scale_after = None
    if scaler:
        with record_function(SCALER_RANGE):
            scaler.unscale_(optimizer)
        # the scale as a device tensor: read after the step, so no extra host sync now
        scale_before = scaler._get_scale_async().clone()
    with record_function(GRAD_NORM_RANGE):
        # the norm only: clip_grad_norm_ would also rewrite every gradient
        grad_norm = fp32_norm([p.grad for p in params if p.grad is not None], device)
    if scaler:
        with record_function(SCALER_RANGE):
            scaler.step(optimizer)
            scaler.update()
        scale_after = scaler._get_scale_async().clone()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm, scale_before, scale_after


def _train_steps(state: _State, model, params, optimizer, scaler, batches, alloc, emit,
                 cancelled, gpm: GpmWindow, count_first=None) -> bool:
    """Warm-up and measured steps; each step is read back while the next one runs.
    ``count_first`` runs the first (warm-up) step, counting its FLOPs."""
    config, rec = state.config, state.rec
    device = state.device_info.torch_device
    timer = StepTimer(device)
    readback = ScalarReadback(device, width=4)  # loss, grad norm, scale before, scale after
    energy = _EnergyWindow(state)
    pending: deque = deque()
    warmup = warmup_steps(config.warmup)  # never a first step in a median
    try:
        for i in range(warmup + config.steps):
            if cancelled():
                return True
            if i == 0:
                state.phase(emit, "warm-up")
            if i == warmup:  # GPM's and the energy counter's window: measured steps
                _drain(state.device_info)  # the warm-up's queued kernels stay outside it
                state.phase(emit, "measuring")
                gpm.start()
                energy.begin()

            def step(i=i):
                return _step(config, rec, device, model, params, optimizer, scaler, batches, i)

            counted = i == 0 and count_first is not None
            alloc.start()
            timer.start()
            loss_sum, grad_norm, scale_before, scale_after = (count_first(step) if counted
                                                              else step())
            mark = timer.stop()
            scalars = readback.push([loss_sum, grad_norm, scale_before, scale_after])
            allocated, reserved = alloc.sample(measured=i >= warmup)
            pending.append((i, i < warmup, mark, scalars, allocated, reserved))
            energy.count(i >= warmup)
            while len(pending) > 1:
                _emit_step(state, emit, timer, readback, pending.popleft())
        _drain(state.device_info)  # the last measured step's kernels stay inside the window
        energy.end()
    finally:  # steps that completed before a failure or a cancel are kept
        while pending:
            _emit_step(state, emit, timer, readback, pending.popleft())
    return False


def _drain(info: DeviceInfo) -> None:
    """Wait for the GPU's queued work: a window read from NVML (GPM, energy) begins and
    ends on an idle GPU, so it covers exactly the measured steps' kernels."""
    if info.kind == "cuda":
        torch.cuda.synchronize(info.torch_device)


class _EnergyWindow:
    """Energy of the measured steps from NVML's total-energy counter (GPU only).

    ``_train_steps`` drains the GPU before ``begin`` and ``end``, so the counter's delta
    covers exactly the measured steps' work. The counter is device-wide: another process
    on the GPU adds to it.
    """

    def __init__(self, state: _State):
        self.state = state
        info = state.device_info
        self.cuda = info.kind == "cuda"
        # NVML on NVIDIA; on ROCm AMD SMI's energy accumulator (engine.measure.amd_smi)
        self.smi, self.handle = info.telemetry()
        self.start_j = self.start_s = None
        self.steps = 0
        if not self.cuda:
            state.energy = (None, 0, "no energy counter on the CPU")
        elif self.handle is None:
            state.energy = (None, 0, f"{self._lib} does not see this GPU: "
                                     f"{self.smi.unavailable_reason()}")

    @property
    def _lib(self) -> str:
        return "NVML" if self.smi is nvml else "AMD SMI"

    def begin(self) -> None:
        if self.handle is None:
            return
        self.start_j, self.start_s = self.smi.energy_j(self.handle), time.perf_counter()
        if self.start_j is None:
            needs = ("nvmlDeviceGetTotalEnergyConsumption needs Volta+" if self.smi is nvml
                     else "amdsmi_get_energy_count is not supported on a virtual machine guest")
            self.state.energy = (None, 0, f"this GPU or driver has no {self._lib} energy "
                                          f"counter ({needs})")

    def count(self, measured: bool) -> None:
        self.steps += measured

    def end(self) -> None:
        if self.start_j is None or not self.steps:
            return
        end_j, seconds = self.smi.energy_j(self.handle), time.perf_counter() - self.start_s
        if end_j is None or end_j <= self.start_j:
            self.state.energy = (None, 0, f"the {self._lib} energy counter did not advance over "
                                          f"the {seconds:.3g} s of measured steps: run more steps")
            return
        this_round = f" of round {self.state.round_index + 1}" if self.state.round_index else ""
        self.state.energy = (end_j - self.start_j, self.steps, (
            f"{self._lib} total-energy counter delta over the {self.steps} measured "
            f"steps{this_round} ({seconds:.3g} s, GPU drained at both ends), divided by steps "
            "and by tokens; device-wide: another process on this GPU would add to it"))


def _emit_step(state: _State, emit, timer: StepTimer, readback: ScalarReadback, item) -> None:
    i, warm, mark, scalars, allocated, reserved = item
    config = state.config
    step_ms = timer.sample(mark)
    loss, norm, before, after = readback.read(scalars)
    model = state.flops.analytic_per_step if state.flops else None
    counted = state.flops.counted_per_step if state.flops else None
    tflops = model / (step_ms / 1e3) / 1e12 if model and step_ms > 0 else None
    mfu = mfu_of(tflops * 1e12, state.peak) if tflops is not None else None
    mfu_measured = (mfu_of(tflops * 1e12, state.measured_peak)
                    if tflops is not None and state.measured_peak else None)
    hfu = mfu_of(counted / (step_ms / 1e3), state.peak) if counted and step_ms > 0 else None
    skipped = after is not None and after < before
    norm = None if skipped else norm  # a skipped step's norm is inf/NaN
    sample = StepSample(
        precision=state.rec.precision,
        step=state.step_offset + i,
        warmup=warm,
        loss=loss,
        step_ms=step_ms,
        tokens_per_s=config.tokens_per_step / (step_ms / 1e3) if step_ms > 0 else 0.0,
        tflops=tflops,
        mfu=mfu,
        allocated_bytes=allocated,
        reserved_bytes=reserved,
        loss_scale=after,
        skipped=skipped,
        grad_norm=norm,
        time_s=time.time(),
        round=state.round_index,
        hfu=hfu,
        mfu_measured=mfu_measured,
    )
    state.steps.append(sample)
    emit(sample)


def tracked_step(config: RunConfig, rec: Recipe, device: torch.device, model, optimizer, scaler,
                 batches) -> memtrack.MeasuredPeak:
    """One more optimiser step, untimed, watched by engine.measure.memtrack from a steady state
    (optimiser state exists, gradients were freed), as the timed steps ran it. engine.run.plan
    runs the same step on fake tensors."""
    watcher = memtrack.MemoryWatcher(device)
    watcher.track_training(model, optimizer, batches[0])
    # torchao's optimisers compile their step with fullgraph=True, which refuses to run
    # under a TorchDispatchMode: here it runs eagerly (the model is eager here already)
    with watcher, torch.compiler.set_stance("force_eager"):
        for micro in range(config.grad_accum):
            batch = batches[micro % len(batches)]
            watcher.phase = "forward"
            with autocast_for(rec, device):
                loss = model(**batch).loss / config.grad_accum
            watcher.phase = "backward"
            (scaler.scale(loss) if scaler else loss).backward()
            del loss
        watcher.phase = "optimizer"
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        watcher.mark_optimizer_state(optimizer)
        watcher.mark("zero_grad")
        optimizer.zero_grad(set_to_none=True)
    return watcher.result()


def _memory_at_rest(model, optimizer, batch, device) -> MemoryBreakdown:
    """What a stopped trial held between steps: exact bytes, but not a peak."""
    held = memtrack.MemoryWatcher(device).held_at_rest(model, optimizer, batch)
    return MemoryBreakdown(
        params_bytes=held["params"], buffers_bytes=held["buffers"],
        quant_state_bytes=held["quant_state"], grads_bytes=held["grads"],
        optimizer_bytes=held["optimizer"], inputs_bytes=held["inputs"],
        activations_bytes=None,
        activations_method="not measured: the run was stopped before the watched step",
        total_bytes=sum(held.values()),
        total_method="held at rest when the run was stopped (weights, optimiser state, "
                     "batch); no step was watched, so this is not the peak",
        notes="a stopped trial: its peak (activations, gradients in flight) was not measured")


# the CPU peak is the dispatch-level tracker's: a buffer bitsandbytes allocates and frees
# inside one of its ops is never seen (the audit of #23 found GPT-NeoX int8 with gradient
# checkpointing 6.3% low, the other families under 1.5%); on CUDA the allocator's peak
# counts them
BNB_TEMPORARIES_NOTE = (
    "measured peak may be low: bitsandbytes' temporaries inside one op (dequantised weight "
    "tiles) are not seen by the tracker on this device; up to 6% was seen (GPT-NeoX int8 "
    "with gradient checkpointing), under 1.5% on other families")


def _memory(measured: memtrack.MeasuredPeak, alloc: AllocatorTracker, info: DeviceInfo,
            compiled: bool, nvml_baseline_bytes: int | None = None) -> MemoryBreakdown:
    method = ("engine.measure.memtrack: every storage from allocation to release over one step; "
              "the largest sum of live bytes")
    if compiled:
        method += " (an eager step: compiled kernels fuse and may allocate less)"
    allocator = alloc.stop()
    notes = ("categories are what was held at the peak; weight copies are autocast's cast "
             "(and bitsandbytes' dequantised) weights")
    if allocator[0] is None:  # the CPU, or no step ran before a cancel
        return watched_memory(measured, method, allocator, notes)
    # NVML and the allocator read at the same moment, the GPU idle: the gap is what the
    # allocator does not hold (CUDA context, loaded kernels), not a peak-vs-now artefact
    torch.cuda.synchronize(info.torch_device)
    reserved_now = alloc.reserved_now()
    nvml_bytes, nvml_method = nvml.process_memory(info.nvml_handle(), {os.getpid()},
                                                  nvml_baseline_bytes)
    return watched_memory(
        measured, method, allocator, notes,
        gpu_notes=". Context gap = NVML process memory - allocator reserved, both read after "
                  "the steps at the same moment",
        nvml_process_bytes=nvml_bytes,
        context_gap_bytes=nvml_bytes - reserved_now if nvml_bytes is not None else None,
        nvml_method=nvml_method,
        reserved_at_nvml_read_bytes=reserved_now,
    )
