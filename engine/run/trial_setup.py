"""A trial's set-up, before its first step: the shapes it cannot run (found before anything
loads), the model at its precision and what it holds, then the optimiser, the GradScaler
and the batches its steps cycle through."""

from __future__ import annotations

import torch

from engine.core.config import WARMUP_RAISED_NOTE, RunConfig, warmup_steps
from engine.core.recipes import Recipe, fp8_shape_reason, mx_shape_reason
from engine.measure import flops as flops_mod
from engine.measure import inventory
from engine.models.load import (
    LoadedModel,
    dims,
    float8_scaling,
    load_config,
    load_model,
    mx_scaling,
    resolve_source,
)
from engine.models.optimizers import adam_eps, make_optimizer, trainable_dtype
from engine.models.training_data import BATCH_POOL, training_batches
from engine.run import fp8_auto
from engine.run.trial_state import TrialState


def shape_reason(config: RunConfig, rec: Recipe, verdict) -> str | None:
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


class _Fp16GradScaler(torch.amp.GradScaler):
    """GradScaler that also unscales fp16 gradients (pure-fp16 recipe).

    Stock GradScaler refuses fp16 gradients because unscaling them in fp16 can
    underflow; the pure fp16 recipe exists to show exactly that cost.
    """

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
        return super()._unscale_grads_(optimizer, inv_scale, found_inf, True)


def make_scaler(rec: Recipe, device: torch.device, config: RunConfig):
    if not rec.use_scaler:
        return None
    cls = _Fp16GradScaler if rec.weight_dtype == torch.float16 else torch.amp.GradScaler
    return cls(device.type, init_scale=config.init_scale, growth_interval=config.growth_interval)


def load(state: TrialState, log, auto=None) -> LoadedModel:
    """The model at the trial's precision; what it holds goes into ``state``. ``auto``: an
    ':auto' recipe's layer choice (engine/run/fp8_auto.py), the others kept in bf16."""
    config, rec, device = state.config, state.rec, state.device_info.torch_device
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
    return loaded


def train_with(state: TrialState, loaded: LoadedModel, log) -> tuple[list, object, object, list]:
    """What the steps train with: (trained parameters, optimiser, GradScaler or None,
    batches)."""
    config, rec, info = state.config, state.rec, state.device_info
    params = [p for p in loaded.model.parameters() if p.requires_grad]
    eps = adam_eps(params)
    optimizer = make_optimizer(state.optimizer, params, config.lr, eps,
                               fused=info.kind == "cuda")
    if eps != 1e-8 and state.optimizer != "sgd":
        dtype = str(trainable_dtype(params)).removeprefix("torch.")
        log(f"Adam epsilon raised from 1e-8 to {eps:.3g}: 1e-8 rounds to 0 in {dtype} (the "
            "trained weights' dtype) and 0/0 would make NaN weights", "warning")
    scaler = make_scaler(rec, info.torch_device, config)
    total = warmup_steps(config.warmup) + config.steps
    if config.warmup < warmup_steps(config.warmup):
        state.notes.append(WARMUP_RAISED_NOTE)
    batches = training_batches(loaded, config, min(BATCH_POOL, total * config.grad_accum),
                               info.torch_device)
    state.distinct_batches = len(batches)
    return params, optimizer, scaler, batches
