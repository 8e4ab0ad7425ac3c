"""One rank of a distributed trial, started by torchrun: ``-m engine.distributed.rank_main DIR``.

It reads ``DIR/spec.json``, trains its slice of each global batch under DDP or FSDP2,
and appends its events as JSON lines to ``DIR/rank<RANK>.jsonl`` as it goes (steps
first, the rank's result last), so the parent sees progress and keeps what was
measured if the trial ends early. A failure is written as a ``failed`` line and the
rank exits 1, which makes torchrun's agent stop the other ranks.
"""

from __future__ import annotations

import json
import math
import os
import socket
import statistics
import sys
import time
from collections import deque
from pathlib import Path

import torch
import torch.distributed as dist

from engine.core.config import RunConfig
from engine.core.events import CommVolume, MonitorSample, RankMemory, StepSample, to_dict
from engine.core.quiet import quiet_libraries
from engine.core.recipes import set_fp32_precision
from engine.distributed.comm import CommCounter, expected_bytes
from engine.distributed.memory import errors_pct, predict_rank_memory
from engine.distributed.recipes import DistRecipe, dist_recipe
from engine.measure.device import nvml_handle_of
from engine.measure.grad_norm import fp32_norm
from engine.measure.monitor import Monitor
from engine.measure.trackers import (
    AllocatorTracker,
    HostTracker,
    NvmlTracker,
    ScalarReadback,
    StepTimer,
)
from engine.models.load import dims, load_model
from engine.models.memory_model import predict_memory
from engine.models.memory_model import shape_of as memory_shape
from engine.models.optimizers import adam_eps, make_optimizer
from engine.models.training_data import BATCH_POOL, training_batches


class _Journal:
    def __init__(self, path: Path):
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the rank's life

    def write(self, kind: str, data: dict) -> None:
        self._fh.write(json.dumps({"type": kind, **data}) + "\n")
        self._fh.flush()


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _bytes(tensors) -> int:
    """Bytes of distinct tensors: a tied weight counts once, views into one flat
    buffer (FSDP2's sharded gradients) count each."""
    seen, total = set(), 0
    for t in tensors:
        t = _local(t)
        key = (t.data_ptr(), t.numel(), t.dtype)
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def _blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The transformer layers: the longest ModuleList in the model."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    if not lists:
        raise ValueError("no list of transformer blocks found to shard: FSDP2 needs one")
    return max(lists, key=len)


class _Activations:
    """Saved-for-backward bytes (saved-tensor hooks), parameters (sharded or all-gathered)
    excluded."""

    def __init__(self):
        self._seen: set[int] = set()
        self.bytes = 0

    def pack(self, tensor: torch.Tensor):
        if isinstance(tensor, torch.nn.Parameter) or hasattr(tensor, "to_local"):
            return tensor
        if hasattr(tensor, "__tensor_flatten__"):  # a wrapper (float8) holds no storage itself
            for name in tensor.__tensor_flatten__()[0]:
                self.pack(getattr(tensor, name))
            return tensor
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr and ptr not in self._seen:
            self._seen.add(ptr)
            self.bytes += storage.nbytes()
        return tensor

    @staticmethod
    def unpack(tensor):
        return tensor

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


class _Unsharded:
    """Peak bytes of all-gathered (plain, non-DTensor) parameters seen at unit pre-forward,
    watched in the counting step only: the hook walks every parameter."""

    def __init__(self, model: torch.nn.Module, units: list[torch.nn.Module]):
        self.model = model
        self.units = units
        self.peak = 0
        self._handles: list = []

    def __enter__(self):
        # registered after fully_shard: runs after FSDP2 has unsharded
        self._handles = [u.register_forward_pre_hook(self._sample) for u in self.units]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _sample(self, module, args) -> None:
        plain = [p for p in self.model.parameters() if not hasattr(p, "to_local")]
        self.peak = max(self.peak, _bytes(plain))


def _wrap(model, rec: DistRecipe, device: torch.device, mesh=None):
    """DDP or FSDP2 around ``model``; returns (wrapped, unit sizes, unsharded tracker).
    ``mesh``: FSDP2's device mesh, by default one over the whole world (engine.run.plan passes
    its own: a mesh cannot be made under fake tensors)."""
    if rec.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model, device_ids=[device.index] if device.index is not None
                                      else None)
        if rec.hook:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            hook = getattr(default_hooks, rec.hook)
            if device.type == "cpu":
                hook = _gloo_hook(hook)
            ddp.register_comm_hook(None, hook)
        return ddp, [], None
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(*rec.mp_policy) if rec.mp_policy else MixedPrecisionPolicy()
    blocks = list(_blocks(model))
    units = []
    for block in blocks:
        units.append((sum(p.numel() for p in block.parameters()), True))
        fully_shard(block, mesh=mesh, mp_policy=policy)
    root_own = sum(p.numel() for p in model.parameters()) - sum(n for n, _ in units)
    # the root stays gathered from forward to backward
    fully_shard(model, mesh=mesh, mp_policy=policy)
    units.append((root_own, False))
    return model, units, _Unsharded(model, [model, *blocks])


def _float8_units(model: torch.nn.Module) -> list[tuple[int, int]]:
    """(float8 Linear weight elements, float8 Linear layers) per FSDP2 unit, in ``_wrap``'s
    order (each block, then the root's own), read before the model is sharded."""
    from torchao.float8.float8_linear import Float8Linear

    def count(modules) -> tuple[int, int]:
        layers = [m for m in modules if isinstance(m, Float8Linear)]
        return sum(m.weight.numel() for m in layers), len(layers)

    blocks = [count(block.modules()) for block in _blocks(model)]
    total = count(model.modules())
    return [*blocks, (total[0] - sum(n for n, _ in blocks), total[1] - sum(k for _, k in blocks))]


def _precompute_float8_scales(model, rec: DistRecipe) -> None:
    """The float8 all-gather recipe's scales for the next all-gathers, from the weights as
    they are now: torchao's one all-reduce of every float8 weight's amax. Without it each
    unit's all-gather would all-reduce its weights' amax on its own, twice per step."""
    if rec.base.fsdp_float8_all_gather:
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

        precompute_float8_dynamic_scale_for_fsdp(model)


def _gloo_hook(hook):
    # DDP refuses hooks *named* bf16_compress_hook unless NCCL runs them; gloo reduces
    # bf16 on the CPU, so the same hook is registered under another name there.
    def compress_hook_on_gloo(state, bucket):  # no annotations: DDP checks them as objects
        return hook(state, bucket)

    return compress_hook_on_gloo


def _scaler(rec: DistRecipe, device: torch.device, config: RunConfig):
    if not rec.use_scaler:
        return None
    kwargs = dict(init_scale=config.init_scale, growth_interval=config.growth_interval)
    if rec.strategy == "fsdp2":
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device.type, **kwargs)
    return torch.amp.GradScaler(device.type, **kwargs)


def _autocast(rec: DistRecipe, device: torch.device):
    from contextlib import nullcontext

    if rec.autocast_dtype is None:
        return nullcontext()
    return torch.autocast(device.type, dtype=rec.autocast_dtype)


def _sync_off(model, rec: DistRecipe, last: bool):
    """Gradients synchronise on the last micro-batch only."""
    from contextlib import nullcontext

    if rec.strategy == "ddp":
        return nullcontext() if last else model.no_sync()
    model.set_requires_gradient_sync(last)
    return nullcontext()


def rank_optimizer(config: RunConfig, params: list, rec: DistRecipe, device: torch.device):
    """The rank's optimizer, fused on CUDA as in the single-process trial: one kernel per
    step, and a GradScaler hands it found-inf as a tensor instead of reading it with
    ``.item()`` mid-step (which stalled fp16-amp ranks only). Not fused SGD under FSDP2:
    torch 2.13 registers DTensor sharding for the fused Adam(W) ops but not for
    ``aten._fused_sgd_`` (torch/distributed/tensor/_ops/_pointwise_ops.py)."""
    fused = device.type == "cuda" and not (config.optimizer == "sgd" and rec.strategy == "fsdp2")
    return make_optimizer(config.optimizer, params, config.lr, adam_eps(params), fused=fused)


def _micro_batches(config: RunConfig, batches: list, i: int):
    for micro in range(config.grad_accum):
        yield micro, batches[(i * config.grad_accum + micro) % len(batches)], (
            micro == config.grad_accum - 1)


def _counting_step(config: RunConfig, rec: DistRecipe, device: torch.device, model, params,
                   optimizer, scaler, batches, counter: CommCounter, saved: _Activations,
                   unsharded: _Unsharded | None) -> int:
    """One step before the timed ones, on the first step's batches, with the collective
    counter, the saved-tensor hooks and the unsharded-parameter hooks on: Python code on
    every op that must not run inside a timed step. Like the single-process trial's FLOP
    probe it is not applied (the weights and the loss scale are left as they were), so
    the timed steps train as one process would. Returns the gradient bytes it left."""
    from contextlib import nullcontext

    with unsharded if unsharded else nullcontext():
        for micro, batch, last in _micro_batches(config, batches, 0):
            hooks = saved.hooks() if micro == 0 else nullcontext()
            with counter, _sync_off(model, rec, last), hooks, _autocast(rec, device):
                loss = model(**batch).loss / config.grad_accum
                (scaler.scale(loss) if scaler else loss).backward()
    grads_bytes = _bytes(p.grad for p in params if p.grad is not None)
    if scaler:
        with counter:
            scaler.unscale_(optimizer)  # the sharded scaler all-reduces found-inf
        scaler.update(scaler.get_scale())  # forgets this step; the scale stays as it was
    # the weights are unchanged: the same scales again, counted this time
    precompute = CommCounter(through_dtensor=True)
    with precompute:
        _precompute_float8_scales(model, rec)
    counter.bytes.update(precompute.bytes)
    counter.calls.update(precompute.calls)
    optimizer.zero_grad(set_to_none=True)
    return grads_bytes


def _step(config: RunConfig, rec: DistRecipe, device: torch.device, model, params, optimizer,
          scaler, batches, i: int):
    """One timed optimiser step; returns its scalars as device tensors, read later."""
    loss_sum = torch.zeros((), device=device)
    for _, batch, last in _micro_batches(config, batches, i):
        with _sync_off(model, rec, last), _autocast(rec, device):
            loss = model(**batch).loss / config.grad_accum
            (scaler.scale(loss) if scaler else loss).backward()
        loss_sum += loss.detach().float()
    before = after = None
    if scaler:
        scaler.unscale_(optimizer)
        before = scaler._get_scale_async().clone()
    # the norm only (clip_grad_norm_ would rewrite every gradient). Under FSDP2, of this
    # rank's shards: on DTensors the norm would be all-reduced inside the step; the
    # ranks' parts are combined after the timed steps instead
    norm = fp32_norm([_local(p.grad) for p in params if p.grad is not None], device)
    if scaler:
        scaler.step(optimizer)
        scaler.update()
        after = scaler._get_scale_async().clone()
    else:
        optimizer.step()
    _precompute_float8_scales(model, rec)
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, norm, before, after


def run_rank(out_dir: Path) -> int:
    spec = json.loads((out_dir / "spec.json").read_text(encoding="utf-8"))
    config = RunConfig.from_dict(spec["config"])
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    journal = _Journal(out_dir / f"rank{rank}.jsonl")
    journal.write("start", {"rank": rank, "local_rank": local_rank, "world_size": world,
                            "host": socket.gethostname(), "pid": os.getpid()})
    cuda = spec["device_kind"] == "cuda"
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        _train(config, dist_recipe(spec["precision"], config.strategy), device, rank, world,
               journal)
    except torch.OutOfMemoryError as exc:
        journal.write("failed", {"status": "oom", "reason": f"rank {rank} ran out of GPU memory: "
                                 f"{str(exc).splitlines()[0]}"})
        return 1
    except MemoryError:
        journal.write("failed", {"status": "oom", "reason": f"rank {rank} ran out of host memory"})
        return 1
    except Exception as exc:
        journal.write("failed", {"status": "error",
                                 "reason": f"rank {rank}: {type(exc).__name__}: {exc}"})
        return 1
    # every rank past its last collective before any leaves: a gloo peer that exits while
    # another still talks to it aborts that one (SIGABRT)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _train(config: RunConfig, rec: DistRecipe, device: torch.device, rank: int, world: int,
           journal: _Journal) -> None:
    base = rec.base
    if device.type == "cuda":  # the rank's own process: set for good, through the new API only
        set_fp32_precision(base)
    torch.manual_seed(config.seed)
    loaded = load_model(config.model, base, device, config.seed, config.trust_remote_code,
                        config.lora_r, config.grad_checkpointing)
    model = loaded.model
    n_params = sum(p.numel() for p in model.parameters())
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    shape = memory_shape(model, getattr(model, "config", loaded.config), dims(loaded.config))
    float8_units = _float8_units(model) if rec.base.fsdp_float8_all_gather else None
    model, units, unsharded = _wrap(model, rec, device)
    _precompute_float8_scales(model, rec)  # the first step's scales, as after every step
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = rank_optimizer(config, params, rec, device)
    scaler = _scaler(rec, device, config)
    # every rank draws the same global batches and takes its own rows of them, so the
    # run trains on exactly what one process with batch x world would
    total = config.warmup + config.steps
    batches = [{k: v[rank * config.batch_size:(rank + 1) * config.batch_size].to(device)
                for k, v in b.items()}
               for b in training_batches(loaded, config,
                                         min(BATCH_POOL, total * config.grad_accum), "cpu",
                                         config.batch_size * world)]
    tracker = NvmlTracker(nvml_handle_of(device.index)) if device.type == "cuda" else HostTracker()
    samples: list[MonitorSample] = []
    monitor = Monitor(tracker, samples.append, config.monitor_hz)
    monitor.start()
    counter, alloc, timer = CommCounter(), AllocatorTracker(device), StepTimer(device)
    readback = ScalarReadback(device, width=4)  # loss, grad norm, scale before and after
    saved = _Activations()
    steps: list[StepSample] = []
    own: list[tuple[float, float | None]] = []  # (loss, grad norm or its local part)
    sharded = rec.strategy == "fsdp2"
    tokens = config.tokens_per_step  # this rank's
    pending: deque = deque()

    def read(item) -> None:
        i, warm, mark, scalars, allocated, reserved = item
        step_ms = timer.sample(mark)
        loss, norm, before, after = readback.read(scalars)
        skipped = after is not None and after < before
        norm = None if skipped else norm  # a skipped step's norm is inf/NaN
        own.append((loss, norm))
        sample = StepSample(
            precision=rec.label, step=i, warmup=warm, loss=loss, step_ms=step_ms,
            tokens_per_s=tokens / (step_ms / 1e3) if step_ms > 0 else 0.0,
            tflops=None, mfu=None, allocated_bytes=allocated, reserved_bytes=reserved,
            loss_scale=after, skipped=skipped, grad_norm=None if sharded else norm,
            time_s=time.time())
        steps.append(sample)
        journal.write("step", to_dict(sample))

    try:
        grads_bytes = _counting_step(config, rec, device, model, params, optimizer, scaler,
                                     batches, counter, saved, unsharded)
        for i in range(total):
            warm = i < config.warmup
            if i == config.warmup:
                alloc.start()
            timer.start()
            scalars = _step(config, rec, device, model, params, optimizer, scaler, batches, i)
            mark = timer.stop()
            pushed = readback.push(list(scalars))
            allocated, reserved = alloc.sample() if not warm else (None, None)
            pending.append((i, warm, mark, pushed, allocated, reserved))
            while len(pending) > 1:  # step i-1 is read while step i runs
                read(pending.popleft())
        while pending:
            read(pending.popleft())
    finally:
        monitor.stop()
    global_loss, global_norm = _global_figures(own, sharded, device, world)
    memory = _measured_memory(model, optimizer, grads_bytes, saved.bytes, unsharded, rec, alloc,
                              buffers)
    activations = predict_memory(
        base, config.optimizer, shape, config.batch_size, config.seq_len,
        config.grad_checkpointing, device.type).activations_bytes
    root = next((n for n, again in units if not again), 0)
    largest = max((n for n, again in units if again), default=0)
    predicted = predict_rank_memory(rec, config.optimizer, n_params, n_trainable, buffers, world,
                                    root, largest, activations)
    expected, formula = expected_bytes(rec, n_trainable, units, config.grad_accum,
                                       float8_units)
    comm = []  # the counting step is one step: its counts are per step
    for key in sorted(set(counter.bytes) | set(expected)):
        kind, dtype = key.split(":")
        comm.append(CommVolume(kind, dtype, int(counter.bytes[key]), expected.get(key),
                               float(counter.calls[key])))
    timed = [s.step_ms for s in steps if not s.warmup]
    median = statistics.median(timed) if timed else None
    journal.write("result", {
        "param_count": n_params, "trainable_params": n_trainable,
        "memory": to_dict(memory), "predicted_memory": to_dict(predicted),
        "memory_error_pct": errors_pct(predicted, memory),
        "comm": [to_dict(c) for c in comm], "comm_formula": formula,
        "monitor_samples": [to_dict(s) for s in samples],
        "median_step_ms": median, "tokens_per_s": tokens / (median / 1e3) if median else None,
        "global_loss": global_loss, "global_grad_norm": global_norm,
    })


def _global_figures(own: list[tuple[float, float | None]], sharded: bool,
                    device: torch.device, world: int) -> tuple[list, list]:
    """Each step's loss over the global batch and its gradient norm, from the ranks' own
    figures in one all-reduce after the timed steps (none runs inside them). Each rank's
    loss is the mean over its equal share of rows; under FSDP2 each rank holds the norm
    of its shards, so the model's norm is the root of the summed squares."""
    if not own:
        return [], []
    rows = [[loss, (norm or 0.0) ** 2 if sharded else 0.0] for loss, norm in own]
    summed = torch.tensor(rows, dtype=torch.float64, device=device)
    dist.all_reduce(summed)
    totals = summed.tolist()
    losses = [row[0] / world for row in totals]
    norms = [None if norm is None else (math.sqrt(row[1]) if sharded else norm)
             for (_, norm), row in zip(own, totals)]
    return losses, norms


def _measured_memory(model, optimizer, grads_bytes: int, activations: int, unsharded,
                     rec: DistRecipe, alloc: AllocatorTracker, buffers: int) -> RankMemory:
    params = _bytes(model.parameters()) + buffers
    opt = _bytes(t for s in optimizer.state.values() for t in s.values()
                 if isinstance(t, torch.Tensor))
    buckets = None
    if rec.strategy == "ddp":
        sizes = model._get_ddp_logging_data().get("bucket_sizes", "")
        buckets = sum(int(x) for x in str(sizes).split(",") if x.strip())
    parts = dict(sharded_params_bytes=params,
                 unsharded_params_bytes=unsharded.peak if unsharded else None,
                 grads_bytes=grads_bytes, optimizer_bytes=opt, activations_bytes=activations,
                 comm_buffers_bytes=buckets)
    peak, _, _ = alloc.stop()
    if peak is None:
        return RankMemory(**parts, total_bytes=sum(v for v in parts.values() if v),
                          total_method="sum of exact tensor bytes (no allocator peak on the CPU)",
                          notes="parameters, gradients and optimizer state are this rank's local "
                                "tensors (shards under FSDP2); unsharded is the peak of "
                                "all-gathered parameters alive at a unit's forward")
    return RankMemory(**parts, peak_allocated_bytes=peak, total_bytes=peak,
                      total_method="torch.cuda.max_memory_allocated over the measured steps")


def main() -> int:
    from engine.core.child import end_with_parent

    end_with_parent()  # a rank never outlives torchrun's agent, even one killed outright
    quiet_libraries()
    return run_rank(Path(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())
