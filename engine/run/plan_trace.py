"""One training step traced on fake tensors, as engine.run.plan plans it.

The model is built under torch's ``FakeTensorMode`` and trained one step with
engine.run.trial's optimiser, scaler and ``tracked_step``: engine.measure.memtrack follows
every allocation, FlopCounterMode counts the FLOPs by dtype, engine.measure.traffic the
bytes moved. engine.run.plan_scale calls ``trace_step`` on cut models, engine.run.plan on
whole ones.
"""

from __future__ import annotations

import dataclasses
from contextlib import ExitStack, contextmanager, nullcontext
from typing import NamedTuple

import torch

from engine.core.config import split_label
from engine.measure import flops as flops_mod
from engine.measure.traffic import ByteCounter
from engine.run.plan_autocast import CPU_POLICY, POLICY
from engine.run.plan_config import PlanConfig


@contextmanager
def _unpacked_rows():
    """Tell transformers' mask builder what the real step finds: no packed sequences.

    transformers reads the position ids' values to see whether a row packs several
    sequences, and takes a fake tensor for "maybe packed": it then builds a full mask,
    which turns off SDPA's causal kernel and its grouped-query path (key/value heads are
    repeated and saved, for every layer). engine.models.load.make_batches passes no position
    ids, so the model's own are 0..n-1 in every row: one sequence per row, which is what
    the same function returns for the real batch.
    """
    from transformers import masking_utils

    real = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = real


class _NoReadScaler:
    """Drives a GradScaler without reading its inf check: a fake tensor has no value.

    ``GradScaler.step`` reads found-inf with ``.item()`` to decide whether to skip; the
    steady state a trial watches is a step that did not skip, which is what this runs.
    """

    def __init__(self, scaler):
        self.scaler = scaler

    def scale(self, loss):
        return self.scaler.scale(loss)

    def step(self, optimizer):
        self.scaler.unscale_(optimizer)
        optimizer.step()

    def update(self):
        self.scaler.update()


@contextmanager
def _fake_world(world: int):
    """FSDP2's device mesh over ``world`` ranks of torch's fake process group (collectives
    return at once and move nothing), made before the fake mode (a mesh reads real
    values) and taken down after the trace."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise ValueError("a process group is already running here: plan --strategy needs a "
                         "process of its own")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        yield init_device_mesh("cpu", (world,))
    finally:
        dist.destroy_process_group()


def _optimizer_on_fake(name: str, params: list, lr: float, eps: float, mode):
    """engine.run.trial's optimiser over fake parameters. bitsandbytes' and torchao's low-bit
    AdamWs build their quantisation maps from real values (``.tolist()``), which a fake
    tensor has none of: the maps are built here outside the fake mode (torchao caches
    its own; bitsandbytes' become fake tensors of the same size), and the step runs their
    registered fake kernels."""
    from engine.models.optimizers import make_optimizer

    if name == "adamw8bit":
        optimizer = make_optimizer(name, params, lr, eps)
        optimizer.name2qmap = {k: mode.from_tensor(v) for k, v in optimizer.name2qmap.items()}
        return optimizer
    if name in ("adamw8bit-ao", "adamw4bit"):
        from torchao.optim import subclass_4bit, subclass_8bit

        for module in (subclass_8bit, subclass_4bit):  # lru_cache'd: the step reuses them
            module.get_qmap_signed()
            module.get_qmap_unsigned()
    with mode:
        return make_optimizer(name, params, lr, eps)


class TracedStep(NamedTuple):
    memory: object  # engine.measure.memtrack.MeasuredPeak
    flops_by_peak_dtype: dict  # one optimiser step's forwards and backwards
    bytes_moved: int  # engine.measure.traffic's count over the watched step, optimiser included
    bytes_moved_fused: int  # the same, as a compiled step moves it (FUSED_CONVENTION)


def trace_step(config: PlanConfig, precision: str, batch_size: int) -> TracedStep:
    """One steady-state training step, traced; under FSDP2, rank 0's step in a fake world
    of ``nproc_per_node`` ranks."""
    with ExitStack() as stack:
        mesh = (stack.enter_context(_fake_world(config.nproc_per_node))
                if config.strategy == "fsdp2" else None)
        return _trace(config, precision, batch_size, mesh)


def _trace(config: PlanConfig, precision: str, batch_size: int, mesh):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from engine.core.recipes import autocast_for, fp32_precision, recipe
    from engine.models.load import load_model, make_batches
    from engine.models.optimizers import adam_eps
    from engine.models.training_data import BATCH_POOL
    from engine.run.plan_autocast import CudaAttention, CudaAutocast, recompute_as_traced
    from engine.run.plan_quant import bitsandbytes_as, load_quantised
    from engine.run.trial_setup import make_scaler
    from engine.run.trial_untimed import tracked_step

    name, optim, reduce = split_label(precision)
    rec = step_rec = recipe(name)
    run = config.run_config(batch_size)
    device = torch.device("cpu")
    mode = FakeTensorMode()
    # bitsandbytes' layers as the card (or the CPU) runs them; nothing for other recipes
    quant = bitsandbytes_as(config.trace_as == "card") if rec.quant else nullcontext()
    with fp32_precision(rec), mode:
        load = load_quantised if rec.quant else load_model
        loaded = load(config.model, rec, device, run.seed, run.trust_remote_code,
                      run.lora_r, config.grad_checkpointing)
        model = loaded.model
        if config.strategy == "fsdp2":
            from engine.distributed.rank_main import _scaler, _wrap
            from engine.distributed.recipes import dist_recipe

            drec = dist_recipe(f"{name}@{reduce}" if reduce else name, "fsdp2")
            model, _, _ = _wrap(model, drec, device, mesh)
            # FSDP2 casts by its MixedPrecisionPolicy instead of autocast, as a rank does
            step_rec = dataclasses.replace(rec, autocast_dtype=None)
        params = [p for p in model.parameters() if p.requires_grad]
    eps = adam_eps(params)  # reads the trained dtypes with a real tensor: outside the mode
    optimizer = _optimizer_on_fake(optim or config.optimizer, params, run.lr, eps, mode)
    with fp32_precision(rec), mode:
        scaler = (_scaler(drec, device, run) if config.strategy == "fsdp2"
                  else make_scaler(rec, device, run))
        scaler = _NoReadScaler(scaler) if scaler is not None else None
    # one batch per micro-batch, as a trial cycles through its pool of distinct batches
    real = make_batches(loaded.config, loaded.task, batch_size, config.seq_len,
                        min(BATCH_POOL, config.grad_accum), run.seed, device)
    # the card's autocast casts, on top of the CPU's autocast region (it acts only there),
    # and its attention kernels
    casts = traced_policy(config, step_rec) == POLICY
    cuda = CudaAutocast() if casts else nullcontext()
    attention = CudaAttention() if config.trace_as == "card" else nullcontext()
    recompute_as_traced(model, casts, config.trace_as == "card")
    with fp32_precision(rec), mode, quant, _unpacked_rows(), cuda, attention:
        batches = [{k: mode.from_tensor(v) for k, v in b.items()} for b in real]

        # a warm-up step to the steady state a trial watches: a forward (whatever a layer
        # makes on its first call), then the optimiser's state, made from gradients of
        # zeros (a backward costs two forwards and makes nothing the watched step finds)
        with autocast_for(step_rec, device):
            loss = model(**batches[0]).loss
        scaled = scaler.scale(loss) if scaler else loss  # a GradScaler's scale: first loss
        if config.strategy == "fsdp2":  # FSDP2 frees its gathered parameters in backward
            scaled.backward()
        else:
            for p in params:
                p.grad = torch.zeros_like(p)
        del loss, scaled
        with torch.compiler.set_stance("force_eager"):  # torchao's step, as tracked_step
            if scaler:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        # the card runs fp32 matmuls on its tf32 tensor cores where the recipe allows it
        counter, by_dtype = flops_mod.counting_mode(tf32=rec.tf32)
        with counter, ByteCounter() as traffic:  # the watched step's bytes: no module hooks
            measured = tracked_step(run, step_rec, device, model, optimizer, scaler, batches)
        counted = flops_mod.counted(counter, by_dtype)
    # FLOPs of one optimiser step: every micro-batch's forward and backward
    return TracedStep(measured,
                      counted.by_peak_dtype,
                      traffic.bytes_moved, traffic.bytes_moved_fused)


def traced_policy(config: PlanConfig, rec) -> str | None:
    """The autocast op lists a trace of ``rec`` follows: the cards' (CUDA's) or, with
    ``trace_as="cpu"``, the CPU's; None where the step has no autocast region."""
    if rec.autocast_dtype is None:
        return None
    return CPU_POLICY if config.trace_as == "cpu" else POLICY
