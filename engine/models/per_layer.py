"""Per-layer precision: which Linear layers a ":keep-..." recipe leaves in high precision.

The seed's per-module table (chapter 11.9.2) keeps the precision-sensitive ends and the
attention in a wider format while the MLPs run in fp8. Layers are found by the model's
structure, not by names of one family:

- ``keep-ends``: the first and last block of every outermost ``nn.ModuleList`` of blocks
  (GPT-2's ``transformer.h``, Llama's ``model.layers``, T5's encoder and decoder
  stacks), the blocks beside the embeddings and the LM head.
- ``keep-attn``: every Linear inside a module whose class is an attention class
  (GPT2Attention, LlamaAttention, BertSelfAttention, T5Attention, ...).
"""

from __future__ import annotations

from torch import nn


def _linears_under(model: nn.Module, prefixes: list[str]) -> set[str]:
    return {name for name, mod in model.named_modules()
            if isinstance(mod, nn.Linear)
            and any(name.startswith(p + ".") for p in prefixes)}


def _end_blocks(model: nn.Module) -> list[str]:
    stacks = [name for name, mod in model.named_modules()
              if isinstance(mod, nn.ModuleList) and len(mod) > 0]
    outermost = [s for s in stacks if not any(s.startswith(o + ".") for o in stacks)]
    return [f"{s}.{i}" for s in outermost
            for i in sorted({0, len(model.get_submodule(s)) - 1})]


def _attention_blocks(model: nn.Module) -> list[str]:
    return [name for name, mod in model.named_modules()
            if name and "attention" in type(mod).__name__.lower()]


def kept_high(model: nn.Module, keep: str | None) -> set[str]:
    """Qualified names of the Linear layers ``keep`` leaves unconverted (empty for None)."""
    if keep is None:
        return set()
    if keep == "keep-ends":
        return _linears_under(model, _end_blocks(model))
    if keep == "keep-attn":
        return _linears_under(model, _attention_blocks(model))
    raise ValueError(f"unknown per-layer option '{keep}': use keep-ends or keep-attn")
