"""One trial: load the model at one precision, count, train for timed steps, summarise.

What was measured before a failure (OOM, an exception, a cancel) is kept: the trial
state accumulates as it goes, and the result is built from it whatever the ending.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine import flops as flops_mod
from engine import inventory, nvml
from engine.config import RunConfig
from engine.device import DeviceInfo
from engine.events import (
    FlopsInfo,
    LogEvent,
    MemoryBreakdown,
    ModuleInfo,
    ParamInfo,
    PredictedMemory,
    StepSample,
    TrialResult,
    TrialSummary,
)
from engine.memory_model import predict_memory, with_errors
from engine.models import dims, load_model, make_batches
from engine.peaks import mfu as mfu_of
from engine.peaks import peak_flops
from engine.recipes import Recipe, autocast_for, recipe
from engine.spread import step_spread
from engine.trackers import AllocatorTracker, StepTimer

BATCH_POOL = 8  # distinct synthetic batches cycled through the steps


class _Fp16GradScaler(torch.amp.GradScaler):
    """GradScaler that also unscales fp16 gradients (pure-fp16 recipe).

    Stock GradScaler refuses fp16 gradients because unscaling them in fp16 can
    underflow; the pure fp16 recipe exists to show exactly that cost.
    """

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
        return super()._unscale_grads_(optimizer, inv_scale, found_inf, True)


def adam_eps(rec: Recipe) -> float:
    """Adam's epsilon, raised where the default would round to zero in the weight dtype.

    In pure fp16, 1e-8 becomes 0, and a parameter whose gradient was 0 so far then
    divides 0 by 0: NaN weights after one step. The smallest normal fp16 value is the
    least epsilon that survives.
    """
    default = 1e-8
    if torch.tensor(default, dtype=rec.weight_dtype).item() == 0.0:
        return float(torch.finfo(rec.weight_dtype).tiny)
    return default


def make_optimizer(name: str, params: list, lr: float, eps: float = 1e-8):
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adamw8bit":
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(params, lr=lr, eps=eps)
    return torch.optim.AdamW(params, lr=lr, eps=eps)


def make_scaler(rec: Recipe, device: torch.device, config: RunConfig):
    if not rec.use_scaler:
        return None
    cls = _Fp16GradScaler if rec.weight_dtype == torch.float16 else torch.amp.GradScaler
    return cls(device.type, init_scale=config.init_scale, growth_interval=config.growth_interval)


def _tensor_bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


class _SavedActivations:
    """Bytes autograd saves for backward, excluding parameters (counted elsewhere)."""

    def __init__(self, model: torch.nn.Module):
        self._param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self._seen: set[int] = set()
        self.bytes = 0

    def pack(self, tensor: torch.Tensor):
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr and ptr not in self._param_ptrs and ptr not in self._seen:
            self._seen.add(ptr)
            self.bytes += storage.nbytes()
        return tensor

    @staticmethod
    def unpack(tensor):
        return tensor

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


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
    predicted: PredictedMemory | None = None
    flops: FlopsInfo | None = None
    steps: list[StepSample] = field(default_factory=list)
    peak: object = None
    round_index: int = 0  # interleaved rounds: steps of earlier rounds come first in ``steps``
    step_offset: int = 0
    distinct_batches: int | None = None

    def result(self, status: str, reason: str | None) -> TrialResult:
        return TrialResult(
            precision=self.rec.precision,
            status=status,
            reason=reason,
            recipe=self.rec.description,
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
            started_s=self.started_s,
            finished_s=time.time(),
        )

    def _summary(self) -> TrialSummary:
        measured = [s for s in self.steps if not s.warmup]
        median_ms = statistics.median(s.step_ms for s in measured) if measured else None
        tokens = self.config.tokens_per_step
        tps = tokens / (median_ms / 1e3) if median_ms else None
        counted = self.flops.counted_per_step if self.flops else None
        tflops = counted / (median_ms / 1e3) / 1e12 if counted and median_ms else None
        peak = self.peak
        mfu = mfu_of(tflops * 1e12, peak) if (tflops is not None and peak) else None
        if peak is None:
            mfu_reason = "no steps measured"
        elif peak.flops_per_s is None:
            mfu_reason = peak.reason
        elif counted is None:
            mfu_reason = "FLOPs could not be counted for this recipe"
        else:
            mfu_reason = None if mfu is not None else "no steps measured"
        mem = self.memory
        last = self.steps[-1] if self.steps else None
        return TrialSummary(
            steps_measured=len(measured),
            median_step_ms=median_ms,
            tokens_per_s=tps,
            tflops=tflops,
            mfu=mfu,
            mfu_reason=mfu_reason,
            peak_flops=peak.flops_per_s if peak else None,
            peak_flops_source=peak.source if peak else None,
            peak_memory_bytes=mem.total_bytes if mem else None,
            peak_memory_method=mem.total_method if mem else "not measured",
            skipped_steps=sum(1 for s in measured if s.skipped),
            final_loss=last.loss if last else None,
            final_loss_scale=last.loss_scale if last else None,
            spread=step_spread(self.steps, tokens),
            distinct_batches=self.distinct_batches,
        )


def run_trial(
    config: RunConfig,
    precision: str,
    device_info: DeviceInfo,
    emit: Callable[[object], None],
    cancelled: Callable[[], bool],
    prior_steps: tuple[StepSample, ...] = (),
    round_index: int = 0,
) -> TrialResult:
    """Measure one precision. Never raises: failures become the trial's status.

    ``prior_steps`` are the steps of this precision's earlier rounds when precisions are
    interleaved (engine/rounds.py): they open the result's steps, new steps are numbered
    after them, and the summary covers them all.
    """
    rec = recipe(precision)
    state = _State(config, rec, device_info, steps=list(prior_steps), round_index=round_index,
                   step_offset=len(prior_steps))
    reason = device_info.unsupported_reason(precision)
    if reason:
        return state.result("unsupported", reason)
    try:
        stopped = _measure(state, emit, cancelled)
    except torch.OutOfMemoryError as exc:
        return state.result("oom", f"out of GPU memory: {str(exc).splitlines()[0]}")
    except MemoryError:
        return state.result("oom", "out of host memory")
    except Exception as exc:
        return state.result("error", f"{type(exc).__name__}: {exc}")
    finally:
        if device_info.kind == "cuda":
            torch.cuda.empty_cache()
    if stopped:
        measured = sum(1 for s in state.steps if not s.warmup)
        return state.result("cancelled", f"stopped by the user after {measured} measured steps")
    return state.result("ok", None)


def _measure(state: _State, emit, cancelled) -> bool:
    """Fill ``state``; returns True when the run was cancelled part-way."""
    config, rec, info = state.config, state.rec, state.device_info
    device = info.torch_device

    def log(msg: str, level: str = "info") -> None:
        emit(LogEvent(level, msg, rec.precision, time.time()))

    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = rec.tf32
        torch.backends.cudnn.allow_tf32 = rec.tf32
    torch.manual_seed(config.seed)

    loaded = load_model(config.model, rec, device, config.seed, config.trust_remote_code,
                        config.lora_r, config.grad_checkpointing)
    model = loaded.model
    state.footprint_bytes, state.footprint_note = loaded.footprint_bytes, loaded.footprint_note
    state.dtype_map = inventory.dtype_map(model)
    state.module_tree = inventory.module_tree(model)
    state.param_count, state.trainable_params = inventory.count_params(model)
    mib = loaded.footprint_bytes / 2**20
    log(f"loaded {config.model}: {state.param_count:,} parameters "
        f"({state.trainable_params:,} trainable), footprint {mib:.2f} MiB")
    if cancelled():
        return True

    params = [p for p in model.parameters() if p.requires_grad]
    eps = adam_eps(rec)
    optimizer = make_optimizer(config.optimizer, params, config.lr, eps)
    if eps != 1e-8 and config.optimizer != "sgd":
        log(f"Adam epsilon raised from 1e-8 to {eps:.3g}: 1e-8 rounds to 0 in "
            f"{str(rec.weight_dtype).removeprefix('torch.')} and 0/0 would make NaN weights",
            "warning")
    scaler = make_scaler(rec, device, config)
    total = config.warmup + config.steps
    batches = make_batches(loaded.config, loaded.task, config.batch_size, config.seq_len,
                           min(BATCH_POOL, total * config.grad_accum), config.seed, device)
    state.distinct_batches = len(batches)

    grads_bytes, saved_bytes = _probe(state, loaded, batches[0], params)
    state.peak = peak_flops(info.name if info.kind == "cuda" else None, rec.peak_dtype)
    step_model = torch.compile(model) if config.compile else model
    alloc = AllocatorTracker(device)
    stopped = _train_steps(state, step_model, params, optimizer, scaler, batches, alloc, emit,
                           cancelled)

    state.memory = _memory(model, optimizer, grads_bytes, saved_bytes, alloc, info)
    d = dims(loaded.config)
    predicted = predict_memory(
        rec, config.optimizer, state.param_count, state.trainable_params,
        inventory.count_quantized_params(model), d["n_layers"], d["hidden"], d["n_heads"],
        d["vocab"], config.batch_size, config.seq_len, config.grad_checkpointing,
        attention_scores_stored=_stores_scores(loaded.config, device),
    )
    state.predicted = with_errors(predicted, state.memory)
    return stopped


def _probe(state: _State, loaded, batch: dict, params: list) -> tuple[int, int]:
    """One uncounted forward+backward: FLOPs, saved activations and gradient bytes."""
    config, rec, model = state.config, state.rec, loaded.model
    device = state.device_info.torch_device
    saved = _SavedActivations(model)

    def step():
        with saved.hooks(), autocast_for(rec, device):
            loss = model(**batch).loss
        loss.backward()

    try:
        counted, by_op = flops_mod.count_flops(step)
        counted_method = ("torch.utils.flop_counter.FlopCounterMode over one forward+backward, "
                          f"x {config.grad_accum} micro-batches")
    except Exception as exc:  # some quantised kernels refuse the counting mode
        model.zero_grad(set_to_none=True)
        step()
        counted, by_op = None, {}
        counted_method = f"FlopCounterMode failed: {type(exc).__name__}: {exc}"
    grads_bytes = sum(_tensor_bytes(p.grad) for p in params if p.grad is not None)
    model.zero_grad(set_to_none=True)
    d = dims(loaded.config)
    mm_total, mm_trainable = flops_mod.matmul_param_counts(model)
    analytic, formula = flops_mod.analytic_flops(
        n_layers=d["n_layers"], hidden=d["hidden"], seq_len=config.seq_len,
        tokens=config.tokens_per_step, matmul_params=mm_total,
        trainable_matmul_params=mm_trainable,
    )
    state.flops = FlopsInfo(
        counted_per_step=counted * config.grad_accum if counted else None,
        counted_method=counted_method,
        analytic_per_step=analytic,
        analytic_formula=formula,
        by_op={k: v * config.grad_accum for k, v in by_op.items()},
    )
    return grads_bytes, saved.bytes


def _train_steps(state: _State, model, params, optimizer, scaler, batches, alloc, emit,
                 cancelled) -> bool:
    """Warm-up and measured steps; each step is read back while the next one runs."""
    config, rec = state.config, state.rec
    device = state.device_info.torch_device
    timer = StepTimer(device)
    pending: deque = deque()
    try:
        for i in range(config.warmup + config.steps):
            if cancelled():
                return True
            alloc.start()
            timer.start()
            loss_sum = torch.zeros((), device=device)
            for micro in range(config.grad_accum):
                batch = batches[(i * config.grad_accum + micro) % len(batches)]
                with autocast_for(rec, device):
                    loss = model(**batch).loss / config.grad_accum
                (scaler.scale(loss) if scaler else loss).backward()
                loss_sum += loss.detach().float()
            scale_before = scale_after = None
            if scaler:
                scaler.unscale_(optimizer)
                # the scale as a device tensor: read after the step, so no extra host sync now
                scale_before = scaler._get_scale_async().clone()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, float("inf"))
            if scaler:
                scaler.step(optimizer)
                scaler.update()
                scale_after = scaler._get_scale_async().clone()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            mark = timer.stop()
            allocated, reserved = alloc.sample()
            pending.append((i, i < config.warmup, mark, loss_sum, grad_norm, scale_before,
                            scale_after, allocated, reserved))
            while len(pending) > 1:
                _emit_step(state, emit, timer, pending.popleft())
    finally:  # steps that completed before a failure or a cancel are kept
        while pending:
            _emit_step(state, emit, timer, pending.popleft())
    return False


def _stores_scores(model_config, device: torch.device) -> bool:
    # Fused GPU attention keeps no s x s score matrix; eager attention and torch's CPU
    # attention path save it for backward.
    eager = getattr(model_config, "_attn_implementation", None) == "eager"
    return eager or device.type == "cpu"


def _emit_step(state: _State, emit, timer: StepTimer, item) -> None:
    i, warm, mark, loss_sum, grad_norm, before, after, allocated, reserved = item
    config = state.config
    step_ms = timer.sample(mark)
    counted = state.flops.counted_per_step if state.flops else None
    tflops = counted / (step_ms / 1e3) / 1e12 if counted and step_ms > 0 else None
    mfu = mfu_of(tflops * 1e12, state.peak) if tflops is not None else None
    scale = float(after.item()) if after is not None else None
    skipped = bool(after.item() < before.item()) if after is not None else False
    loss = float(loss_sum.item())
    norm = None if skipped else float(grad_norm.item())  # a skipped step's norm is inf/NaN
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
        loss_scale=scale,
        skipped=skipped,
        grad_norm=norm,
        time_s=time.time(),
        round=state.round_index,
    )
    state.steps.append(sample)
    emit(sample)


def _memory(model, optimizer, grads_bytes: int, activations: int,
            alloc: AllocatorTracker, info: DeviceInfo) -> MemoryBreakdown:
    params_bytes = inventory.unique_param_bytes(model) + sum(
        b.numel() * b.element_size() for b in model.buffers()
    )
    opt_bytes = sum(_tensor_bytes(s) for s in optimizer.state.values())
    known = params_bytes + grads_bytes + opt_bytes + activations
    exact = dict(
        params_bytes=params_bytes,
        grads_bytes=grads_bytes,
        optimizer_bytes=opt_bytes,
        activations_bytes=activations,
        activations_method="bytes autograd saved for backward in one micro-batch "
                           "(saved-tensor hooks)",
    )
    peak_alloc, peak_res = alloc.stop()
    if peak_alloc is None:  # the CPU, or no step ran before a cancel
        return MemoryBreakdown(
            **exact,
            total_bytes=known,
            total_method="sum of exact tensor bytes (no allocator peak counter: "
                         f"{'CPU run' if info.kind == 'cpu' else 'no step ran'})",
            notes="temporaries, allocator reserve and context are not measurable without an "
                  "allocator peak; on the CPU, host RSS is in the monitor samples",
        )
    h = nvml.handle(info.index)
    nvml_bytes = nvml.process_memory_bytes(h, {os.getpid()}) if h is not None else None
    return MemoryBreakdown(
        **exact,
        temporaries_bytes=max(0, peak_alloc - known),
        peak_allocated_bytes=peak_alloc,
        peak_reserved_bytes=peak_res,
        nvml_process_bytes=nvml_bytes,
        context_gap_bytes=nvml_bytes - peak_res if nvml_bytes is not None else None,
        total_bytes=peak_alloc,
        total_method="torch.cuda.max_memory_allocated over the measured steps",
        notes="temporaries = peak allocated - (parameters + gradients + optimizer state + "
              "saved activations), floored at 0: activations are freed while gradients are "
              "allocated, so the categories overlap in time",
    )
