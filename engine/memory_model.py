"""What a recipe should need in memory, from bytes per parameter and an activation model.

Static memory is bytes per parameter by role: the weights as stored, a gradient and
optimiser state for each trainable weight. Activations follow Korthikanti et al. 2022
("Reducing Activation Recomputation in Large Transformer Models"): one transformer
layer saves s·b·h·(34 + 5·a·s/h) bytes for backward at 2-byte activations, where the
5·a·s/h part is the attention score, softmax and dropout matrices.
"""

from __future__ import annotations

import dataclasses

from engine.config import OPTIMIZERS
from engine.events import MemoryBreakdown, PredictedMemory
from engine.recipes import Recipe

FP32 = 4
NF4_BLOCK = 64  # bitsandbytes 4-bit block size; one fp32 absmax per block

# measured MemoryBreakdown field for each predicted category
_MEASURED = {
    "params": "params_bytes",
    "grads": "grads_bytes",
    "optimizer": "optimizer_bytes",
    "activations": "activations_bytes",
    "total": "total_bytes",
}


def _quantized_bytes(quant: str) -> float:
    # int8 also keeps one fp32 scale per output row: under 0.01 B/param, left out.
    return 1.0 if quant == "int8" else 0.5 + FP32 / NF4_BLOCK


def _optimizer_bytes(optimizer: str, weight_bytes: int) -> float:
    if optimizer == "adamw":
        return 2.0 * weight_bytes  # m and v, in the parameter's dtype
    if optimizer == "adamw8bit":
        return 2.0  # bitsandbytes keeps m and v as 8-bit codes
    return 0.0  # plain SGD (no momentum) keeps no state


def _static_note(recipe: Recipe, optimizer: str, per: dict) -> str:
    opt = {"adamw": "AdamW m+v", "adamw8bit": "8-bit AdamW m+v", "sgd": "SGD (no state)"}[
        optimizer
    ]
    w, g, o = per["weights"], per["grads"], per["optimizer"]
    trained = f"{w:g} weights + {g:g} grads + {o:g} {opt}"
    if recipe.quant:
        parts = [f"{recipe.quant} base frozen: quantised weights {per['quantized_weights']:g} B"]
        if "frozen_weights" in per:
            parts.append(f"other frozen weights {per['frozen_weights']:g} B (peft upcasts "
                         "them to fp32)")
        return ", ".join([*parts, f"LoRA adapters {trained}"])
    line = f"{trained} = {w + g + o:g} B/param"
    if recipe.autocast_dtype is None:
        return line
    half = str(recipe.autocast_dtype).removeprefix("torch.")
    line += (
        f". Mixed precision: the fp32 weights are the master copy; autocast makes {half} "
        "copies on the fly that live only through forward and backward"
    )
    if optimizer == "adamw":
        line += (
            ". ZeRO (Rajbhandari et al.) counts fp16 weights 2 + fp16 grads 2 + fp32 master, "
            "m and v 12: the same 16 B/param"
        )
    return line


def predict_memory(
    recipe: Recipe,
    optimizer: str,
    total_params: int,
    trainable_params: int,
    quantized_params: int,
    n_layers: int,
    hidden: int,
    n_heads: int,
    vocab: int,
    batch_size: int,
    seq_len: int,
    grad_checkpointing: bool,
    attention_scores_stored: bool = True,
) -> PredictedMemory:
    """Predicted bytes by category for one training step of ``recipe``.

    ``quantized_params`` counts the weights bitsandbytes holds quantised (logical
    count); the rest of the frozen weights is ``total - trainable - quantized``. Pass
    ``attention_scores_stored=False`` when attention runs in a fused kernel (SDPA flash
    or memory-efficient), which keeps no s×s matrices for backward.
    """
    sizes = {"total_params": total_params, "n_layers": n_layers, "hidden": hidden,
             "n_heads": n_heads, "vocab": vocab, "batch_size": batch_size, "seq_len": seq_len}
    for name, value in sizes.items():
        if value < 1:
            raise ValueError(f"{name} must be 1 or more (got {value}): pass the model's value")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer '{optimizer}': choose from {', '.join(OPTIMIZERS)}")
    frozen = total_params - trainable_params - quantized_params
    if min(trainable_params, quantized_params, frozen) < 0:
        raise ValueError(
            f"parameter counts do not add up (total {total_params:,}, trainable "
            f"{trainable_params:,}, quantised {quantized_params:,}): trainable plus quantised "
            "must not exceed the total"
        )
    if quantized_params and not recipe.quant:
        raise ValueError(f"recipe {recipe.precision} quantises nothing: pass quantized_params=0")

    weight = recipe.weight_dtype.itemsize
    trainable_weight = FP32 if recipe.lora else weight  # peft creates LoRA adapters in fp32
    per = {"weights": float(trainable_weight), "grads": float(trainable_weight),
           "optimizer": _optimizer_bytes(optimizer, trainable_weight)}
    if quantized_params:
        per["quantized_weights"] = _quantized_bytes(recipe.quant)
    if frozen:
        per["frozen_weights"] = float(FP32 if recipe.quant else weight)
    params_bytes = round(
        quantized_params * per.get("quantized_weights", 0.0)
        + frozen * per.get("frozen_weights", 0.0)
        + trainable_params * per["weights"]
    )
    grads_bytes = round(trainable_params * per["grads"])
    optimizer_bytes = round(trainable_params * per["optimizer"])
    static = params_bytes + grads_bytes + optimizer_bytes
    per["static"] = static / total_params

    act = (recipe.autocast_dtype or recipe.weight_dtype).itemsize
    s, b, h, a, n_l = seq_len, batch_size, hidden, n_heads, n_layers
    scores = 5 * a * s * s * b if attention_scores_stored else 0
    # Korthikanti's bytes are for 2-byte activations; scale to this recipe's size.
    layer = (34 * s * b * h + scores) * act // 2
    scores_term = " + 5·a·s/h" if attention_scores_stored else ""
    if grad_checkpointing:
        # only each layer's input is kept; one layer's activations exist while it recomputes
        layers_bytes = n_l * act * s * b * h + layer
        layers_text = (
            f"L·{act}·s·b·h layer inputs + one recomputed layer s·b·h·(34{scores_term})·{act}/2"
            f" = {n_l}·{act}·{s}·{b}·{h} + {layer:,} = {layers_bytes:,} B"
        )
    else:
        layers_bytes = n_l * layer
        layers_text = (
            f"L·s·b·h·(34{scores_term})·{act}/2 = {n_l}·{s}·{b}·{h}·(34"
            f"{f' + 5·{a}·{s}/{h}' if attention_scores_stored else ''})·{act}/2"
            f" = {layers_bytes:,} B (Korthikanti et al. 2022)"
        )
    # logits in the activation dtype, their fp32 upcast for the loss and its gradient
    logits_bytes = b * s * vocab * (act + FP32 + FP32)
    activations_bytes = layers_bytes + logits_bytes
    total = static + activations_bytes

    counts = f"total {total_params:,} params, {trainable_params:,} trainable"
    if quantized_params:
        counts += f", {quantized_params:,} quantised"
    formula = "\n".join(
        (
            f"{recipe.precision} with {optimizer} ({counts})",
            f"static: {_static_note(recipe, optimizer, per)}",
            f"params {params_bytes:,} B + grads {grads_bytes:,} B + optimizer "
            f"{optimizer_bytes:,} B = {static:,} B ({per['static']:.2f} B/param)",
            f"layers: {layers_text}",
            f"logits and loss: b·s·V·({act} + 4 + 4) = {b}·{s}·{vocab}·{act + 8}"
            f" = {logits_bytes:,} B",
            f"total: {static:,} + {activations_bytes:,} = {total:,} B",
        )
    )
    return PredictedMemory(
        params_bytes=params_bytes,
        master_bytes=0,  # no recipe keeps a separate copy: AMP's master is the fp32 weights
        grads_bytes=grads_bytes,
        optimizer_bytes=optimizer_bytes,
        activations_bytes=activations_bytes,
        total_bytes=total,
        bytes_per_param=per,
        formula=formula,
    )


def with_errors(predicted: PredictedMemory, measured: MemoryBreakdown) -> PredictedMemory:
    """``predicted`` with error_pct = 100·(predicted − measured)/measured per category.

    A category the measurement lacks (None) or measured as 0 has no percentage.
    """
    errors = {}
    for category, field in _MEASURED.items():
        actual = getattr(measured, field)
        if actual:
            errors[category] = 100.0 * (getattr(predicted, field) - actual) / actual
    return dataclasses.replace(predicted, error_pct=errors)
