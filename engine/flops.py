"""FLOPs of one training step, counted by torch and predicted by the 6·N·T rule.

``count_flops`` runs the step under ``torch.utils.flop_counter.FlopCounterMode``,
which counts matmul-like aten ops (mm, addmm, bmm, convolutions, fused attention)
and nothing else: norms, activations, softmax and the loss are a rounding error
next to the matmuls, and the analytic rule leaves them out for the same reason.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count
from transformers.pytorch_utils import Conv1D

_aten = torch.ops.aten


def _cpu_sdpa_flop(query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_sdpa_backward_flop(grad_out_shape, query_shape, key_shape, value_shape, *args,
                            **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


# torch registers formulas for the CUDA attention kernels only; without these the CPU
# path of scaled_dot_product_attention would count as zero FLOPs.
CPU_ATTENTION_FLOPS = {
    _aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flop,
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward_flop,
}


def count_flops(fn: Callable[[], None]) -> tuple[int, dict[str, int]]:
    """Run ``fn`` (one forward + backward) and return its FLOPs, total and by aten op."""
    counter = FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS)
    with counter:
        fn()
    by_op = {str(op): int(n) for op, n in counter.get_flop_counts()["Global"].items()}
    return int(counter.get_total_flops()), by_op


def matmul_param_counts(model: nn.Module) -> tuple[int, int]:
    """(total, trainable) weights that take part in matmuls: Linear and GPT-2 Conv1D.

    bitsandbytes layers subclass ``nn.Linear`` and keep ``in_features``/``out_features``
    while their storage is packed, so the logical size comes from those. peft LoRA
    wrappers are plain modules holding a base layer and two ``nn.Linear`` adapters, which
    are counted as they are met. A tied lm_head is an ``nn.Linear`` and counts here even
    though its weight is also the embedding table (a lookup, no matmul). A module applied
    several times per step (ALBERT-style layer sharing) is counted once.
    """
    total = trainable = 0
    for module in model.modules():
        if isinstance(module, nn.Linear):
            n = module.in_features * module.out_features
        elif isinstance(module, Conv1D):
            n = module.nx * module.nf
        else:
            continue
        total += n
        if module.weight.requires_grad:
            trainable += n
    return total, trainable


def analytic_flops(
    *,
    n_layers: int,
    hidden: int,
    seq_len: int,
    tokens: int,
    matmul_params: int,
    trainable_matmul_params: int,
) -> tuple[int, str]:
    """FLOPs of one step over ``tokens`` tokens, and the formula with its numbers.

    Each matmul weight costs 2 FLOPs per token forward, 2 for the input gradient and
    2 for its own gradient; a frozen weight (the LoRA base) skips the last 2. Attention
    adds QK^T and AV, 2·s·h FLOPs each per token and layer forward, and twice that
    backward. Causal masking is ignored, as FlopCounterMode ignores it. Fused (flash)
    attention also recomputes QK^T in backward; FlopCounterMode counts that, the rule
    does not, since MFU conventionally counts the model's work, not recomputation.
    """
    n, n_train, t = matmul_params, trainable_matmul_params, tokens
    attention = 3 * 2 * 2 * n_layers * seq_len * hidden * t
    total = 2 * n * t + 2 * n * t + 2 * n_train * t + attention
    formula = (
        "2·N·T forward + 2·N·T input gradients + 2·N_trainable·T weight gradients"
        " + 3·(2·2·L·s·h)·T attention"
        f" = 2·{n:,}·{t:,} + 2·{n:,}·{t:,} + 2·{n_train:,}·{t:,} + 12·{n_layers}·{seq_len}"
        f"·{hidden}·{t:,} = {total:,} FLOPs"
        f" (N = {n:,} matmul weights, N_trainable = {n_train:,}, T = {t:,} tokens,"
        f" L = {n_layers} layers, s = {seq_len}, h = {hidden})"
    )
    return total, formula
