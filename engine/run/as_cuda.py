"""A CPU trial that keeps for backward what a CUDA card keeps: the reference the memory
model's CUDA terms are fitted against for families no card ran
(``scripts/memory_error_table.py --as-cuda``).

Three things a card does differently, each made to happen on the CPU:

- autocast casts by CUDA's op lists (``engine.run.plan_autocast.CudaAutocast``: CUDA runs
  ``pow``, ``exp``, ``layer_norm``, ``softmax``... in fp32);
- attention takes CUDA's fused kernel (``CudaAttention``);
- bitsandbytes' int8 matmul runs its own int8 kernels outside autocast on CUDA
  (0.50 ``MatMul8bitLt``: the output in the input's dtype, fp32 after peft's fp32
  LayerNorms), where the CPU path (``MatMul8bitFp``) calls ``F.linear``, which autocast
  lowers to fp16: here the CPU path runs with autocast off, as the card's kernels do.

Checked against the H200 of 2026-11-27 (GPT-2, batch 4 x 256): the activations one
forward leaves for backward are 1.5% (int8) and 1.8% (nf4) above the card's, where the
plain CPU trial's are 28% (int8) below. Gradient checkpointing is not covered: torch
reruns a checkpointed layer with Python function modes off, so its recompute would cast
as the CPU does.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager

import torch


@contextmanager
def as_cuda():
    """While entered, a trial's steps (engine.run.trial_steps, trial_flops, trial_untimed) cast,
    attend and run int8 matmuls as CUDA."""
    import bitsandbytes as bnb

    from engine.core.recipes import autocast_for as cpu_autocast
    from engine.run import trial_flops, trial_steps, trial_untimed
    from engine.run.plan_autocast import CudaAttention, CudaAutocast

    modules, cpu_matmul = (trial_steps, trial_flops, trial_untimed), bnb.matmul

    @contextmanager
    def autocast_for(rec, device):
        with ExitStack() as stack:
            stack.enter_context(cpu_autocast(rec, device))
            if rec.autocast_dtype is not None:
                stack.enter_context(CudaAutocast())
            stack.enter_context(CudaAttention())
            yield

    def int8_matmul(*args, **kwargs):
        with torch.autocast("cpu", enabled=False):
            return cpu_matmul(*args, **kwargs)

    for module in modules:
        module.autocast_for = autocast_for
    bnb.matmul = int8_matmul
    try:
        yield
    finally:
        for module in modules:
            module.autocast_for = cpu_autocast
        bnb.matmul = cpu_matmul
