"""Distributed recipes: a precision name read per strategy, plus an optional "@dtype".

The precision names stay those of a single process; a strategy says how each is
distributed, and a suffix ``@bf16`` / ``@fp16`` / ``@fp32`` sets the dtype gradients
are reduced in (DDP: a communication hook; FSDP2: ``MixedPrecisionPolicy.reduce_dtype``).

- DDP keeps a full replica on every rank and all-reduces gradients. ``fp32`` reduces
  fp32 gradients; ``fp32@bf16`` / ``fp32@fp16`` register ``bf16_compress_hook`` /
  ``fp16_compress_hook``; ``bf16-amp`` / ``fp16-amp`` autocast as in one process.
- FSDP2 ``fully_shard``s each transformer block and the root: parameters, gradients
  and optimizer state are sharded over the ranks. ``fp32``: no policy; ``bf16-amp``:
  ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` (``bf16-amp@bf16``:
  both bf16); ``fp16-amp``: (fp16, fp32) with the sharded GradScaler. ``fp8``: torchao
  float8 Linear layers under the (bf16, fp32) policy: weights gathered in bf16, cast to
  float8 after. ``fp8-fsdp-ag``: the same with torchao's float8 all-gather: each float8
  Linear weight shard is cast to float8 before the all-gather (its other parameters stay
  bf16; FSDP2 gathers them all as one byte buffer), and the weight scales are precomputed
  after each optimizer step in one all-reduce.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.recipes import Recipe, recipe

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# single-process recipes that have a distributed reading (quantised, fp8 and pure fp16
# need LoRA/torchao/a custom scaler that these wrappers do not combine with yet)
SUPPORTED = ("fp32", "tf32", "bf16-amp", "fp16-amp", "bf16")
FSDP2_FP8 = ("fp8", "fp8-fsdp-ag")  # torchao float8 Linear layers, under FSDP2 only


def dtype_name(dtype: torch.dtype) -> str:
    return {v: k for k, v in DTYPES.items()}[dtype]


@dataclass(frozen=True)
class DistRecipe:
    label: str  # as on the --precision list, e.g. "fp32@bf16"
    strategy: str  # "ddp" or "fsdp2"
    base: Recipe
    autocast_dtype: torch.dtype | None  # autocast region (DDP); FSDP2 casts by policy
    param_dtype: torch.dtype  # dtype parameters are gathered and computed in
    reduce_dtype: torch.dtype  # dtype gradients cross the wire in
    hook: str | None  # DDP communication hook name, None for plain fp32 all-reduce
    mp_policy: tuple[torch.dtype | None, torch.dtype | None] | None  # FSDP2 (param, reduce)
    use_scaler: bool
    sharded: str  # what is divided by the number of ranks
    collectives: dict  # collective -> dtype name it carries

    @property
    def description(self) -> str:
        wire = ", ".join(f"{k} in {v}" for k, v in self.collectives.items())
        extra = f"; {self.hook}" if self.hook else ""
        if self.mp_policy:
            p, r = (dtype_name(d) if d else "None" for d in self.mp_policy)
            extra = f"; MixedPrecisionPolicy(param_dtype={p}, reduce_dtype={r})"
        scaler = "; ShardedGradScaler" if self.use_scaler and self.strategy == "fsdp2" else (
            "; GradScaler" if self.use_scaler else "")
        if self.base.fsdp_float8_all_gather:
            scaler += ("; torchao float8 all-gather (enable_fsdp_float8_all_gather), weight "
                       "scales by precompute_float8_dynamic_scale_for_fsdp after each "
                       "optimizer step")
        return (f"{self.strategy.upper()} {self.base.precision}{extra}{scaler}: "
                f"{self.sharded}; {wire}")


def unsupported_reason(label: str, strategy: str) -> str | None:
    name, _, reduce = label.partition("@")
    choices = SUPPORTED + (FSDP2_FP8 if strategy == "fsdp2" else ())
    if name not in choices:
        return (f"{name} has no {strategy} recipe here: use one of {', '.join(choices)} "
                f"with --strategy {strategy}")
    grad = dtype_name(recipe(name).weight_dtype)
    if reduce and grad != "fp32" and reduce != grad:
        return f"{name} gradients are {grad}: they can only be reduced in {grad}"
    return None


def dist_recipe(label: str, strategy: str) -> DistRecipe:
    """The recipe for ``label`` under ``strategy``; ``ValueError`` where there is none."""
    reason = unsupported_reason(label, strategy)
    if reason:
        raise ValueError(reason)
    name, _, reduce = label.partition("@")
    base = recipe(name)
    grad_dtype = base.weight_dtype
    if strategy == "ddp":
        reduce_dtype = DTYPES[reduce] if reduce else grad_dtype
        hook = None if reduce_dtype == grad_dtype else f"{dtype_name(reduce_dtype)}_compress_hook"
        return DistRecipe(
            label, strategy, base, base.autocast_dtype, base.weight_dtype, reduce_dtype, hook,
            None, base.use_scaler, "nothing: every rank holds all parameters, gradients "
            "and optimizer state", {"all_reduce": dtype_name(reduce_dtype)})
    param_dtype = base.autocast_dtype or base.weight_dtype  # amp: FSDP2 casts, no autocast
    reduce_dtype = DTYPES[reduce] if reduce else grad_dtype
    policy = None
    if param_dtype != base.weight_dtype or reduce_dtype != grad_dtype:
        policy = (param_dtype if param_dtype != base.weight_dtype else None, reduce_dtype)
    gathered = dtype_name(param_dtype)
    if base.fsdp_float8_all_gather:
        gathered = f"fp8 Linear weights + {gathered} rest, one uint8 buffer per unit"
    return DistRecipe(
        label, strategy, base, None, param_dtype, reduce_dtype, None, policy, base.use_scaler,
        "parameters, gradients and optimizer state (each block and the root a unit)",
        {"all_gather": gathered, "reduce_scatter": dtype_name(reduce_dtype)})
