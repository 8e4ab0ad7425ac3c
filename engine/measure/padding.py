"""What padding an odd GEMM dimension would change: the one hint the odd-shape rows lead to.

On an H200 three GEMMs of GPT-2's 50,257-wide vocabulary (the LM head forward and its two
backward GEMMs) ran as CUTLASS sm75 ``align1`` kernels: 3.9 of the step's 5.8 ms of
matmul, 15.8% of the measured step. Padded to a multiple of 64 the dimension lets cuBLAS
pick aligned Tensor Core kernels, for a few extra rows of work.
"""

from __future__ import annotations

import math

PAD_TO = 64  # the multiple Megatron-LM and nanoGPT pad vocabularies to


def padding_hint(odd_gemms, step_ms: float | None) -> str | None:
    """The odd dimension with the most GEMM time, what those GEMMs cost in the step and
    what padding it to a multiple of ``PAD_TO`` would add; None when nothing is odd."""
    by_dim: dict[int, list] = {}
    for g in odd_gemms:
        for v in {g.m, g.n, g.k}:
            if v % 8:
                by_dim.setdefault(v, []).append(g)
    if not by_dim:
        return None
    dim, gemms = max(by_dim.items(), key=lambda kv: sum(g.ms for g in kv[1]))
    ms = sum(g.ms for g in gemms)
    padded = math.ceil(dim / PAD_TO) * PAD_TO
    share = f", {100 * ms / step_ms:.1f}% of the step" if step_ms else ""
    calls = sum(g.calls for g in gemms)
    return (f"{calls} GEMM call{'s' if calls != 1 else ''} with a dimension of {dim:,} took "
            f"{ms:.2f} ms{share}. Padding it to {padded:,} (a multiple of {PAD_TO}: "
            f"+{padded - dim} rows, {100 * (padded / dim - 1):.2f}% more work in those GEMMs) "
            "lets them run on aligned Tensor Core kernels; the time saved is at most theirs. "
            "If it is the vocabulary, pad the embedding and LM head "
            f"(transformers: model.resize_token_embeddings(len(tokenizer), "
            f"pad_to_multiple_of={PAD_TO})); the padded logits are never a target")
