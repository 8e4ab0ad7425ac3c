"""What a loaded model holds: every parameter's dtype and bytes, and the module tree.

Tied weights are one ``Parameter`` object reachable under two names (that is how
transformers ties GPT-2's ``lm_head.weight`` to ``transformer.wte.weight``), so
"shared" here means the same object, the rule ``nn.Module.parameters()`` and
transformers' ``get_memory_footprint()`` use as well.

bitsandbytes stores quantised weights packed: an ``Int8Params`` holds one int8 per
weight, a ``Params4bit`` two 4-bit codes per uint8 in a flat ``(n/2, 1)`` tensor. Bytes
are always the packed storage; shapes and counts are the logical weight matrix, so a
model has the same parameter count at every precision.
"""

from __future__ import annotations

import math

from torch import nn
from transformers.pytorch_utils import Conv1D

from engine.core.events import ModuleInfo, ParamInfo


def is_quantized(param) -> bool:
    """bitsandbytes' quantised parameter classes (Int8Params, Params4bit)."""
    return type(param).__module__.startswith("bitsandbytes")


def logical_shape(param) -> tuple[int, ...]:
    """The weight matrix a parameter stands for (a packed 4-bit one keeps it in quant_state)."""
    quant_state = getattr(param, "quant_state", None)
    if quant_state is not None and getattr(quant_state, "shape", None) is not None:
        return tuple(quant_state.shape)
    return tuple(param.shape)


def logical_numel(param) -> int:
    return math.prod(logical_shape(param))


def storage_bytes(tensor) -> int:
    return tensor.numel() * tensor.element_size()


def type_name(module: nn.Module) -> str:
    """Class name, prefixed by the peft tuner for adapter wrappers ("lora.Linear")."""
    parts = type(module).__module__.split(".")
    if len(parts) > 2 and parts[0] == "peft" and parts[1] == "tuners":
        return f"{parts[2]}.{type(module).__name__}"
    return type(module).__name__


def dtype_map(model: nn.Module) -> list[ParamInfo]:
    """Every parameter under every name it has; later names of a shared one get ``tied_to``
    and 0 bytes, so the rows' bytes add up to the storage the model holds."""
    first_name: dict[int, str] = {}
    rows = []
    for module_name, module in model.named_modules(remove_duplicate=False):
        owner = type_name(module)
        for name, param in module.named_parameters(prefix=module_name, recurse=False):
            tied_to = first_name.setdefault(id(param), name)
            rows.append(
                ParamInfo(
                    name=name,
                    shape=logical_shape(param),
                    dtype=str(param.dtype).removeprefix("torch."),
                    device=str(param.device),
                    bytes=storage_bytes(param) if tied_to == name else 0,  # counted once
                    numel=logical_numel(param),
                    trainable=param.requires_grad,
                    module_type=owner,
                    tied_to=None if tied_to == name else tied_to,
                )
            )
    return rows


def _is_float8(module: nn.Module) -> bool:
    return type(module).__name__ == "Float8Linear"  # torchao's, without importing torchao


def matmul_dtypes(model: nn.Module, high: str | None) -> dict[str, str]:
    """Qualified name -> the dtype each Linear / GPT-2 Conv1D layer multiplies in: "fp8"
    for a torchao Float8Linear, ``high`` (the recipe's compute dtype) for the others;
    bitsandbytes layers and, with ``high`` None, unconverted layers are left out."""
    found = {}
    for name, module in model.named_modules():
        if _is_float8(module):
            found[name] = "fp8"
        elif (isinstance(module, nn.Linear | Conv1D) and high is not None
              and not is_quantized(module.weight)):
            found[name] = high
    return found


def module_tree(model: nn.Module, max_depth: int | None = None,
                high_dtype: str | None = None) -> list[ModuleInfo]:
    """Modules in pre-order (root first, named ""), each with its subtree's unique params.

    ``quantized`` marks a bitsandbytes layer and every module that contains one, so a
    tree folded at any depth still shows where the quantised weights are; likewise
    ``matmul_dtype`` names every dtype the matmul layers under a module run in (see
    ``matmul_dtypes``), so a per-layer recipe shows which blocks stayed in bf16.
    """
    dtypes = matmul_dtypes(model, high_dtype)
    rows = []
    for name, module in model.named_modules():
        under = {d for leaf, d in dtypes.items()
                 if not name or leaf == name or leaf.startswith(name + ".")}
        depth = name.count(".") + 1 if name else 0
        if max_depth is not None and depth > max_depth:
            continue
        params = list(module.parameters())
        rows.append(
            ModuleInfo(
                name=name,
                type=type_name(module),
                depth=depth,
                bytes=sum(storage_bytes(p) for p in params),
                params=sum(logical_numel(p) for p in params),
                quantized=any(is_quantized(p) for p in params),
                matmul_dtype=", ".join(sorted(under)) or None,
            )
        )
    return rows


def unique_param_bytes(model: nn.Module) -> int:
    return sum(storage_bytes(p) for p in model.parameters())


def count_params(model: nn.Module) -> tuple[int, int]:
    """(total, trainable) logical parameter counts, each shared parameter once."""
    params = list(model.parameters())
    total = sum(logical_numel(p) for p in params)
    trainable = sum(logical_numel(p) for p in params if p.requires_grad)
    return total, trainable


def count_quantized_params(model: nn.Module) -> int:
    """Logical count of the weights bitsandbytes holds quantised (input to the memory model)."""
    return sum(logical_numel(p) for p in model.parameters() if is_quantized(p))


def footprint_bytes(model: nn.Module) -> int:
    """Parameters plus buffers, each once: transformers' ``get_memory_footprint()``."""
    return unique_param_bytes(model) + sum(storage_bytes(b) for b in model.buffers())
