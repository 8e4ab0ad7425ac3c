"""What a recipe should need in memory: bytes per parameter and a per-layer activation model.

Static memory is bytes per parameter by role: the weights as stored, a gradient and
optimiser state for each trainable weight (bitsandbytes' 8-bit AdamW exactly: one byte
per state element plus a float32 absmax per 256-element block, float32 states for
tensors under ``min_8bit_size``, and the shared quantisation maps once).

Activations are what one forward saves for backward, per token, as a sum over the
pieces of a layer: the hidden width h, the query width heads x head_dim, the key/value
width (grouped-query attention shrinks it), the MLP width (a SwiGLU MLP saves more per
unit than a GELU one), the attention scores (heads x sequence: eager attention keeps
them, fused attention does not) and per-head statistics, plus the parts outside the
layers (embeddings, final norm, logits and loss; T5's relative position bias, once per
batch). The bytes per unit of each piece are calibrated per architecture family,
activation mode and attention implementation against engine.measure.memtrack on the CPU,
with the key/value cache off as trials load models (``scripts/calibrate_activations.py``,
stored in ``resources/activation_calibration.json``); autocast on a CUDA device has its
own mode, measured under CUDA's op lists (engine.run.plan_autocast.CudaAutocast). A
family not in that table falls back to Korthikanti et al. 2022, s·b·h·(34 + 5·a·s/h)
bytes per layer at 2-byte activations, and says so. Autocast's low-precision weight
copies, which linear layers save for backward, are their own category: 2 bytes per
matmul weight. Terms are fitted per family on whole CPU trials by
``scripts/memory_error_table.py`` (same file): what a k-bit base with LoRA adapters saves
beyond the half-autocast calibration, outside the layers and in them (for CUDA, on CPU
trials run as the card keeps tensors, engine.run.as_cuda), and what a checkpointed
layer's rerun holds beyond its activations; docs/memory-model.md has the error per
family, shape, recipe and device.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from functools import cache

import torch
from torch import nn

from engine.core.config import STATE_OPTIMIZERS
from engine.core.events import MemoryBreakdown, PredictedMemory
from engine.core.recipes import Recipe
from engine.core.resources import RESOURCES
from engine.measure import inventory

FP32 = 4
NF4_BLOCK = 64  # bitsandbytes 4-bit block size; one fp32 absmax per block
NF4_CODE = 16 * 4  # each 4-bit weight's own code book: 16 fp32 values
CUDA_BLOCK = 512  # the CUDA caching allocator's smallest block (engine.measure.memtrack)
ADAM8_BLOCK = 256  # bitsandbytes blockwise 8-bit optimiser state: one fp32 absmax per block
ADAM8_MIN_SIZE = 4096  # bitsandbytes' min_8bit_size: smaller tensors keep fp32 state
ADAM8_QMAPS = 2 * 256 * FP32  # the two shared 256-entry quantisation maps
# torchao 0.18 torchao/optim (subclass_8bit/4bit/fp8.py): bits per code, elements per fp32
# scale, and the lookup map each state tensor carries (its own copy, not shared)
TORCHAO_STATE = {"adamw8bit-ao": (8, 256, 256 * FP32), "adamw4bit": (4, 128, 16 * FP32),
                 "adamw-fp8": (8, 256, 0)}
TORCHAO_MIN_SIZE = 4096  # torchao quantises state tensors of at least this many elements
CALIBRATION = RESOURCES / "activation_calibration.json"
LAYER_BASIS = ("hidden", "attention_width", "kv_width", "mlp_width", "scores", "heads", "one")
# "position_bias": heads x sequence / batch per token, i.e. heads x sequence^2 for the whole
# batch: T5's relative position bias, made once per stack for every sequence of the batch.
# A family fitted before it has three outer coefficients (zip stops there)
OUTER_BASIS = ("hidden", "vocab", "one", "position_bias")

# predicted category -> (measured MemoryBreakdown field, or phase whose start it is held at)
_MEASURED = {
    "params": ("params_bytes", None),
    "buffers": ("buffers_bytes", None),
    "quant_state": ("quant_state_bytes", None),
    "optimizer": ("optimizer_bytes", None),
    "grads": ("grads", "optimizer"),  # every gradient exists when the optimiser step begins
    "activations": ("activations", "backward"),  # what the forward saved, when backward begins
    "weight_copies": ("weight_copies", "backward"),
    "total": ("total_bytes", None),  # the peak
}


# torchao's training layers: their forward casts the weight per call and saves the fp32 one
CONVERTED_LAYERS = ("Float8Linear", "MXFP8Linear", "NVFP4Linear")


@dataclass(frozen=True)
class ModelShape:
    """What the memory model needs to know of a loaded model."""

    model_type: str
    dims: dict  # engine.models.load.dims
    total_params: int
    trainable_params: int
    quantized_params: int
    trainable_sizes: tuple[int, ...]  # element count of each trainable tensor
    matmul_params: int  # weights in Linear/Conv1D layers (autocast casts these)
    trainable_matmul_params: int
    int8_rows: int  # output rows of int8 layers: one fp32 scale (SCB) each
    buffers_bytes: int
    attention: str  # the attention implementation: "eager", "sdpa", ...
    # trainable parameters inside the repeated layers, and those whose gradient arrives only
    # after every layer's backward (input embeddings not tied to the output head)
    layer_trainable_params: int = 0
    late_grad_params: int = 0
    # transformers' causal-LM loss upcasts the logits to fp32; the masked-LM and seq2seq
    # heads' cross-entropy runs in the logits' dtype
    loss_in_fp32: bool = True
    lora_in_features: int = 0  # summed input width of the LoRA-adapted layers
    # weights of the layers converted to float8 / MX training layers: torchao saves their
    # high-precision weight for backward and casts it again there, so no copy is kept
    converted_matmul_params: int = 0
    # matmul weights outside the layer stacks, not quantised (the LM head, BERT's MLM
    # transform, OPT's projections): their autocast copies remain with checkpointing
    outer_matmul_params: int = 0
    # element count of each quantised weight: nf4 keeps an fp32 absmax per 64-element block
    # and its own 16-entry fp32 code book per weight; int8 an fp32 scale per output row
    quantized_sizes: tuple[int, ...] = ()
    int8_row_counts: tuple[int, ...] = ()
    # a trainable input embedding that is also the output head: its lookup's gradient comes
    # last, as a dense table, and is added to the head's into a new one
    tied_embedding_params: int = 0
    # parameters a half-precision load kept in fp32 (transformers' _keep_in_fp32_modules
    # under fp16, T5's ``wo``; _keep_in_fp32_modules_strict under bf16 too), read from the
    # loaded model's dtypes: a model drawn with from_config keeps none
    fp32_kept_params: int = 0
    # summed input width of those kept layers that are Linear: their forward casts its
    # half input up to fp32 and saves that copy for backward (T5's ``wo``)
    fp32_kept_in_features: int = 0


def shape_of(model: nn.Module, config, model_dims: dict) -> ModelShape:
    from engine.measure.flops import matmul_param_counts
    from engine.models.load import task_of

    total, trainable = inventory.count_params(model)
    mm_total, mm_trainable = matmul_param_counts(model)
    rows = sum(m.out_features for m in model.modules()
               if isinstance(m, nn.Linear) and type(m.weight).__name__ == "Int8Params")
    stacks = _layer_stacks(model)
    return ModelShape(
        model_type=config.model_type,
        dims=model_dims,
        total_params=total,
        trainable_params=trainable,
        quantized_params=inventory.count_quantized_params(model),
        trainable_sizes=tuple(p.numel() for p in model.parameters() if p.requires_grad),
        matmul_params=mm_total,
        trainable_matmul_params=mm_trainable,
        int8_rows=rows,
        buffers_bytes=sum(inventory.storage_bytes(b) for b in model.buffers()),
        attention=getattr(config, "_attn_implementation", None) or "sdpa",
        layer_trainable_params=_trainable_in(stacks),
        late_grad_params=_trainable_in(_input_embeddings(model, stacks)),
        tied_embedding_params=_tied_embedding(model),
        loss_in_fp32=task_of(config) == "causal-lm",
        lora_in_features=sum(m.in_features for m in model.modules()
                             if hasattr(m, "lora_A") and hasattr(m, "in_features")),
        converted_matmul_params=sum(m.weight.numel() for m in model.modules()
                                    if type(m).__name__ in CONVERTED_LAYERS),
        outer_matmul_params=_outer_matmul_params(model, stacks),
        quantized_sizes=tuple(inventory.logical_numel(p) for p in model.parameters()
                              if inventory.is_quantized(p)),
        int8_row_counts=tuple(m.out_features for m in model.modules()
                              if isinstance(m, nn.Linear)
                              and type(m.weight).__name__ == "Int8Params"),
        fp32_kept_params=_fp32_kept(model),
        fp32_kept_in_features=_fp32_kept_in_features(model),
    )


def _fp32_kept(model: nn.Module) -> int:
    """Elements of the fp32 parameters of a model whose other float parameters are half."""
    params = list(model.parameters())
    if not any(p.dtype in (torch.float16, torch.bfloat16) for p in params):
        return 0
    return sum(p.numel() for p in params if p.dtype == torch.float32)


def _fp32_kept_in_features(model: nn.Module) -> int:
    """Summed input width of the fp32 Linear layers of a model whose other weights are half."""
    if not _fp32_kept(model):
        return 0
    return sum(m.in_features for m in model.modules()
               if isinstance(m, nn.Linear) and m.weight.dtype == torch.float32)


def _outer_matmul_params(model: nn.Module, stacks: list[nn.Module]) -> int:
    """Unquantised matmul weights (Linear, GPT-2's Conv1D) outside the layer stacks."""
    from transformers.pytorch_utils import Conv1D

    inside = {id(m) for st in stacks for m in st.modules()}
    total = 0
    for m in model.modules():
        if id(m) in inside or inventory.is_quantized(getattr(m, "weight", None)):
            continue
        if isinstance(m, nn.Linear):
            total += m.in_features * m.out_features
        elif isinstance(m, Conv1D):
            total += m.nx * m.nf
    return total


def _layer_stacks(model: nn.Module) -> list[nn.Module]:
    """The outermost ModuleLists of one repeated block class: the model's layer stacks."""
    stacks, inside = [], set()
    for m in model.modules():
        if id(m) in inside or not isinstance(m, nn.ModuleList) or not len(m):
            continue
        if len({type(c) for c in m}) == 1 and any(True for _ in m.parameters()):
            stacks.append(m)
            inside.update(id(x) for x in m.modules())
    return stacks


def _input_embeddings(model: nn.Module, stacks: list[nn.Module]) -> list[nn.Module]:
    """Embedding tables outside the layers that are not also the output head (a tied
    head's gradient comes first, with the head's backward)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    skip = {id(head.weight)} if head is not None and hasattr(head, "weight") else set()
    inside = {id(p) for st in stacks for p in st.parameters()}
    return [m for m in model.modules() if isinstance(m, nn.Embedding)
            and id(m.weight) not in skip and id(m.weight) not in inside]


def _tied_embedding(model: nn.Module) -> int:
    """Elements of the trainable input embedding the output head shares, or 0."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    weight = getattr(head, "weight", None)
    if weight is None or embed is None or weight is not getattr(embed, "weight", None):
        return 0
    return weight.numel() if weight.requires_grad else 0


def _trainable_in(modules: list[nn.Module]) -> int:
    seen = {id(p): p.numel() for m in modules for p in m.parameters() if p.requires_grad}
    return sum(seen.values())


def basis_values(model_dims: dict, seq_len: int, batch: int = 1) -> dict:
    """Units per token of each piece: one list for a layer, one for the outer model."""
    d = model_dims
    return {
        "layer": [d["hidden"], d["attention_width"], d["kv_heads"] * d["head_dim"],
                  d["intermediate"], d["n_heads"] * seq_len, d["n_heads"], 1],
        "outer": [d["hidden"], d["vocab"], 1, d["n_heads"] * seq_len / batch],
    }


@cache
def calibration() -> dict:
    return json.loads(CALIBRATION.read_text(encoding="utf-8"))


def _quantized_bytes(quant: str) -> float:
    return 1.0 if quant == "int8" else 0.5


def optimizer_bytes_per_param(optimizer: str, weight_bytes: int) -> float:
    """Optimiser state per trainable parameter of a large tensor: AdamW's m and v in the
    parameter's dtype, 8-bit AdamW's two codes (its absmax and small tensors' fp32 state
    aside: ``predict_memory`` counts those exactly), none for plain SGD."""
    if optimizer == "adamw":
        return 2.0 * weight_bytes
    if optimizer == "adamw8bit":
        return 2.0
    if optimizer in TORCHAO_STATE:
        return 2.0 * TORCHAO_STATE[optimizer][0] / 8
    if optimizer == "adamw-bf16-sr":
        return 4.0
    return 0.0


def _torchao_bytes(optimizer: str, sizes: tuple[int, ...], weight_bytes: int,
                   device_type: str) -> tuple[int, str]:
    """torchao's m and v: codes plus an fp32 scale per block and a lookup map per tensor
    for tensors of TORCHAO_MIN_SIZE+ elements in whole blocks, the weight's dtype for the
    rest; bf16 for every tensor with bf16-sr. Each parameter's step count is an fp32 tensor
    on the host: counted on the CPU only."""
    steps = FP32 * len(sizes) if device_type == "cpu" else 0
    if optimizer == "adamw-bf16-sr":
        total = 2 * 2 * sum(sizes) + steps
        return total, f"bf16 m+v: 2·2·{sum(sizes):,} + {steps:,} B step counters = {total:,} B"
    bits, block, qmap = TORCHAO_STATE[optimizer]
    big = [n for n in sizes if n >= TORCHAO_MIN_SIZE and n % block == 0]
    small = sum(sizes) - sum(big)
    codes = 2 * sum(big) * bits // 8
    scales = 2 * FP32 * sum(n // block for n in big)
    maps = 2 * qmap * len(big)
    plain = 2 * weight_bytes * small
    total = codes + scales + maps + plain + steps
    text = (f"{optimizer}: 2·{sum(big):,}·{bits}/8 codes + 2·4·n/{block} scales = {scales:,} B"
            f" + {maps:,} B lookup maps + 2·{weight_bytes}·{small:,} unquantised states"
            f" + {steps:,} B step counters = {total:,} B")
    return total, text


def _adam8_bytes(sizes: tuple[int, ...]) -> tuple[int, str]:
    big = [n for n in sizes if n >= ADAM8_MIN_SIZE]
    small = sum(n for n in sizes if n < ADAM8_MIN_SIZE)
    codes = 2 * sum(big)
    absmax = 2 * FP32 * sum(math.ceil(n / ADAM8_BLOCK) for n in big)
    total = codes + absmax + 2 * FP32 * small + (ADAM8_QMAPS if big else 0)
    text = (f"8-bit AdamW: 2·{sum(big):,} codes + 2·4·ceil(n/256) absmax = {absmax:,} B"
            f" + 8·{small:,} fp32 states of tensors under {ADAM8_MIN_SIZE} elements"
            f" + {ADAM8_QMAPS if big else 0:,} B shared quantisation maps = {total:,} B")
    return total, text


def _storage(nbytes: int, device_type: str) -> int:
    """A storage's bytes as the tracker counts them: CUDA's caching allocator hands out
    512-byte blocks at least."""
    return -(-nbytes // CUDA_BLOCK) * CUDA_BLOCK if device_type == "cuda" else nbytes


def _quant_state_bytes(shape: ModelShape, recipe: Recipe, device_type: str) -> int:
    """bitsandbytes' state beside the packed weights: per nf4 weight an fp32 absmax per
    64-element block and its own 16-entry fp32 code book (``QuantState.code``); per int8
    layer an fp32 scale (SCB) per output row. Without the per-weight sizes (a shape made
    by hand), the totals by block and row."""
    if recipe.quant == "nf4":
        if not shape.quantized_sizes:
            return shape.quantized_params * FP32 // NF4_BLOCK
        return sum(_storage(math.ceil(n / NF4_BLOCK) * FP32, device_type)
                   + _storage(NF4_CODE, device_type) for n in shape.quantized_sizes)
    if shape.int8_row_counts:
        return sum(_storage(rows * FP32, device_type) for rows in shape.int8_row_counts)
    return shape.int8_rows * FP32


def _mode(recipe: Recipe, model_type: str, device_type: str) -> tuple[str, float, str]:
    """(calibration mode, scale, what it stands for) for the recipe's activations. On a
    CUDA device autocast casts by CUDA's op lists (more ops in fp32 than the CPU's), so
    its activations have their own calibration ("amp-cuda") where the family has one."""
    if recipe.autocast_dtype is not None:
        modes = calibration()["families"].get(model_type, {})
        cuda = device_type == "cuda" and "amp-cuda" in modes
        note = "half autocast as CUDA casts it" if cuda else "half autocast"
        if recipe.lora:
            note += "; LoRA adapters' own fp32 activations are not in the calibration"
        if recipe.fp8:
            note += "; float8 casts are not in the calibration"
        return ("amp-cuda" if cuda else "amp"), 1.0, note
    if recipe.weight_dtype.itemsize == 2:
        return "half", 1.0, "pure half precision"
    return "fp32", 1.0, "fp32"


def _activations(shape: ModelShape, recipe: Recipe, batch: int, seq: int,
                 grad_checkpointing: bool, device_type: str) -> _Saved:
    """What the forward saves for backward, whole and in the pieces the phases need."""
    d, tokens = shape.dims, batch * seq
    mode, scale, note = _mode(recipe, shape.model_type, device_type)
    attention = "eager" if shape.attention == "eager" else "sdpa"
    family = calibration()["families"].get(shape.model_type, {}).get(mode, {}).get(attention)
    act = _act_bytes(recipe)
    if family is None:
        h, a = d["hidden"], d["n_heads"]
        scores = 5 * a * seq * seq * batch if attention == "eager" else 0
        layer = (34 * seq * batch * h + scores) * act // 2
        outer = tokens * d["vocab"] * (act + 2 * FP32)
        method = (f"uncalibrated for '{shape.model_type}' ({mode}, {attention}): Korthikanti "
                  "et al. 2022 per layer, logits and loss outside")
        stacks = [("layer", d["n_layers"], layer)]
    else:
        x = basis_values(d, seq, batch)

        def per_layer(coef):
            return round(scale * tokens * sum(c * v for c, v in zip(coef, x["layer"])))

        if d.get("encoder_decoder"):
            stacks = [("encoder layer", d["encoder_layers"], per_layer(family["encoder_layer"])),
                      ("decoder layer", d["decoder_layers"], per_layer(family["decoder_layer"]))]
        else:
            stacks = [("layer", d["n_layers"], per_layer(family["layer"]))]
        outer = round(scale * tokens * sum(c * v for c, v in zip(family["outer"], x["outer"])))
        method = (f"per-layer model calibrated for '{shape.model_type}' ({note}, {attention} "
                  f"attention) against the tracker on the CPU")
    layers = sum(n for _, n, _ in stacks)
    per_vocab = calibration().get("lora_outer", {}).get(shape.model_type, {}).get(
        recipe.quant or "", 0.0) if recipe.lora else 0.0
    if per_vocab:
        # outside the layers a k-bit base with LoRA keeps other logits than autocast over
        # fp32 weights (peft's fp32 head): fitted per token per vocabulary unit on the
        # checkpointed trials, where the layers save only their inputs
        outer += round(per_vocab * tokens * d["vocab"])
        method += f"; {per_vocab} B per token per vocabulary unit outside the layers"
    per_unit, per_score = _lora_terms(shape.model_type, recipe, device_type)
    lora_on = bool((per_unit or per_score) and shape.lora_in_features)
    if lora_on:
        # what a k-bit base with adapters saves beyond the half-autocast calibration (the
        # adapters' inputs and outputs, fp32 LayerNorm outputs): per token per unit of the
        # adapted layers' input width, shared evenly by the layers; and where a family's
        # attention keeps other score tensors over a k-bit base (T5: fewer), per token
        # per head x sequence in each layer
        lora = round(per_unit * tokens * shape.lora_in_features / layers)
        scores = round(per_score * tokens * d["n_heads"] * seq)
        stacks = [(name, n, b + lora + scores) for name, n, b in stacks]
        method += (f"; {recipe.quant} base with LoRA: {per_unit} B per token per adapted "
                   "input unit more" + (f", {per_score} B per token per head x sequence in "
                                        "each layer" if per_score else ""))
    if shape.fp32_kept_in_features and recipe.weight_dtype.itemsize < FP32 \
            and recipe.autocast_dtype is None and not recipe.quant:
        # a layer the load kept in fp32 casts its half input up and saves that copy (the
        # calibration's models kept none): 2 more bytes per token per kept input unit,
        # shared evenly by the layers
        kept = round((FP32 - act) * tokens * shape.fp32_kept_in_features / layers)
        stacks = [(name, n, b + kept) for name, n, b in stacks]
        method += (f"; layers kept in fp32 save their input in fp32: {kept:,} B more "
                   "per layer")
    # (a checkpointed rerun's own bytes are fitted beside it, rerun_flow, without the
    # score term: the rerun of a T5 layer over a k-bit base was not seen to keep fewer)
    reruns = tuple(b - (scores if per_score and lora_on else 0) for _, _, b in stacks)
    one_layer = max(reruns)
    # each checkpointed layer keeps its input, in the residual stream's dtype (the
    # weights': autocast's half outputs are added to it; fp32 over a k-bit base, whose
    # embeddings and norms peft upcasts), and on the CPU the generator's state
    # torch.utils.checkpoint saves to replay dropout (a GPU's is host memory). Where the
    # load kept layers in fp32 (T5's wo, whose output is added to the stream) a stack's
    # later layers take an fp32 stream, its first the embeddings' half output
    rng = torch.get_rng_state().numel() if device_type == "cpu" else 0
    residual = FP32 if recipe.quant else recipe.weight_dtype.itemsize
    later = FP32 if shape.fp32_kept_params else residual
    layer_input = tokens * d["hidden"] * residual + rng
    stack_inputs = tuple(layer_input + (n - 1) * (tokens * d["hidden"] * later + rng)
                         for _, n, _ in stacks)
    if grad_checkpointing:
        inputs = sum(stack_inputs)
        saved = inputs + outer
        formula = (f"checkpointed: {layers} layer inputs (b·s·h·{residual}"
                   + (f", b·s·h·{later} after each stack's first" if later != residual else "")
                   + f" + {rng:,} B RNG state) = {inputs:,} B + "
                   f"outside the layers {outer:,} B = {saved:,} B (one layer reruns in "
                   f"backward: {one_layer:,} B)")
    else:
        inputs = 0
        saved = sum(n * b for _, n, b in stacks) + outer
        parts = " + ".join(f"{n}·{b:,} B per {name}" for name, n, b in stacks)
        formula = f"{parts} + outside the layers {outer:,} B = {saved:,} B"
    rerun_stacks = tuple((name, n, b, i) for (name, n, _), b, i
                         in zip(stacks, reruns, stack_inputs))
    return _Saved(saved, one_layer, layer_input, inputs, layers, formula, method,
                  rerun_stacks)


def _lora_terms(model_type: str, recipe: Recipe, device_type: str) -> tuple[float, float]:
    """The k-bit LoRA terms (per adapted input unit, per score), fitted on CPU trials, and
    for CUDA on CPU trials run as a card keeps its tensors (engine.run.as_cuda:
    bitsandbytes' int8 kernels run outside autocast there); the CPU's where a family has
    no CUDA fit. A single number is the first term alone."""
    if not recipe.lora:
        return 0.0, 0.0
    fitted = calibration().get("lora_activations", {}).get(model_type, {})
    if device_type == "cuda":
        fitted = calibration().get("lora_activations_cuda", {}).get(model_type, fitted)
    value = fitted.get(recipe.quant or "", 0.0)
    return (float(value), 0.0) if isinstance(value, int | float) else tuple(value)


@dataclass(frozen=True)
class _Saved:
    """What the forward leaves for backward, and the pieces the phases of backward need."""

    total: int
    one_layer: int  # the largest layer's activations: what a checkpointed rerun makes
    layer_input: int  # a checkpointed first layer's saved input (RNG state included)
    inputs: int  # every checkpointed layer's saved input
    layers: int
    formula: str
    method: str
    # per layer stack in forward order: (name, layers, one layer's rerun activations, the
    # stack's saved layer inputs)
    stacks: tuple = ()


# a phase's term -> the MemoryBreakdown category it is held in
_TERM_CATEGORY = {
    "params": "params", "buffers": "buffers", "quantisation state": "quant_state",
    "optimizer": "optimizer", "inputs": "inputs", "weight copies": "weight_copies",
    "activations": "activations", "logits and log-softmax gradients": "temporaries",
    "grads": "grads", "optimiser scratch": "temporaries", "layer inputs": "activations",
    "one layer input": "activations", "gradients so far": "grads",
    "the rerun's activations": "activations", "gradient flow": "temporaries",
    "the rerun's weight copies": "weight_copies", "tied embedding gradients": "temporaries"}


def _reruns(shape: ModelShape, recipe: Recipe, act: _Saved, held: list, batch: int,
            seq: int, grad_bytes: int) -> dict:
    """Live bytes while a checkpointed layer reruns in backward, for each stack's first
    rerun (its last layer: the inputs of its layers and of the stacks before it still held)
    and its last (its first layer: one of its inputs left). Backward reruns the stacks
    from the last (an encoder-decoder's decoder first), and the gradients made so far
    grow by one layer's with each rerun. A single stack has two phases, "first layer
    rerun" and "last layer rerun"; an encoder-decoder two per stack.

    Beside the rerun's activations: the gradient flowing back through the stack, and the
    rerun's own autocast weight copies."""
    d, tokens = shape.dims, batch * seq
    layer_grads = shape.layer_trainable_params * grad_bytes
    early_grads = (shape.trainable_params - shape.layer_trainable_params
                   - shape.late_grad_params) * grad_bytes
    per_layer_grads = layer_grads / act.layers
    per_hidden, per_score = _rerun_flow(shape.model_type, _rerun_kind(recipe))
    # the score tensors' bytes do not follow the activation dtype (T5's softmax is fp32)
    flow = round((per_hidden * d["hidden"] * _act_bytes(recipe) + per_score * d["n_heads"]
                  * seq) * tokens)
    copies = 0
    if recipe.autocast_dtype is not None and (recipe.weight_dtype.itemsize == FP32
                                              or recipe.quant):
        copies = 2 * max(0, shape.matmul_params - shape.quantized_params
                         - _outer_matmul(shape)) // act.layers
    phases, done = {}, 0  # done: layers already rerun
    for index in reversed(range(len(act.stacks))):
        name, n, rerun, inputs = act.stacks[index]
        before = sum(i for _, _, _, i in act.stacks[:index])  # earlier stacks' inputs
        terms = [("the rerun's activations", rerun), ("gradient flow", flow),
                 ("the rerun's weight copies", copies)]
        last_input = ("one layer input", act.layer_input) if not before \
            else ("layer inputs", before + act.layer_input)
        phases[f"first {name} rerun"] = [
            *held, ("layer inputs", before + inputs),
            ("gradients so far", early_grads + round(done * per_layer_grads)), *terms]
        phases[f"last {name} rerun"] = [
            *held, last_input,
            ("gradients so far", early_grads + round((done + n - 1) * per_layer_grads)),
            *terms]
        done += n
    return phases


def _outer_matmul(shape: ModelShape) -> int:
    """Matmul weights outside the checkpointed layers; for a shape made by hand without
    them, the LM head's vocabulary x hidden."""
    return shape.outer_matmul_params or shape.dims["vocab"] * shape.dims["hidden"]


def _rerun_flow(model_type: str, kind: str) -> tuple[float, float]:
    """A checkpointed rerun's bytes beyond its saved activations (the gradient flowing
    back, backward's intermediates, the attention's transient score tensors), per token
    per hidden unit and per token per head x sequence, in the activation dtype: fitted
    per family and rerun kind by scripts/memory_error_table.py (a single number is the
    first term alone); for a family not fitted, the median of the fitted families' first
    terms alone."""
    fitted = calibration().get("rerun_flow", {})
    def terms(value) -> tuple[float, float]:
        return (float(value), 0.0) if isinstance(value, int | float) else tuple(value)

    if kind in fitted.get(model_type, {}):
        return terms(fitted[model_type][kind])
    values = sorted(terms(by[kind])[0] for by in fitted.values() if kind in by)
    return (values[len(values) // 2] if values else 0.0), 0.0


def _rerun_kind(recipe: Recipe) -> str:
    """LoRA over a k-bit base reruns under peft's set-up (checkpointing turned on by
    prepare_model_for_kbit_training, fp32 norms, frozen weights): fitted apart."""
    return "lora" if recipe.lora else "full"


def _act_bytes(recipe: Recipe) -> int:
    return 2 if recipe.autocast_dtype is not None else recipe.weight_dtype.itemsize


def predict_memory(recipe: Recipe, optimizer: str, shape: ModelShape, batch_size: int,
                   seq_len: int, grad_checkpointing: bool,
                   device_type: str = "cpu") -> PredictedMemory:
    """Predicted bytes by category, and the peak, for one training step of ``recipe``.

    The peak is the largest of the step's phases: backward's start (everything static,
    the weight copies and saved activations, and the loss's gradient of the logits); with
    checkpointing, the first and the last layer's rerun in backward (``_reruns``: live
    bytes change linearly between them, so the largest is at one end); and the optimiser
    step (every gradient, and the optimiser's scratch: torch's AdamW one tensor at a time
    on the CPU and none fused on a GPU; other optimisers every gradient's worth on a GPU).
    """
    for name, value in (("batch_size", batch_size), ("seq_len", seq_len),
                        ("total_params", shape.total_params)):
        if value < 1:
            raise ValueError(f"{name} must be 1 or more (got {value}): pass the model's value")
    if optimizer not in STATE_OPTIMIZERS:
        raise ValueError(f"unknown optimizer '{optimizer}': choose from "
                         f"{', '.join(STATE_OPTIMIZERS)}")
    frozen = shape.total_params - shape.trainable_params - shape.quantized_params
    if min(shape.trainable_params, shape.quantized_params, frozen) < 0:
        raise ValueError(
            f"parameter counts do not add up (total {shape.total_params:,}, trainable "
            f"{shape.trainable_params:,}, quantised {shape.quantized_params:,}): trainable "
            "plus quantised must not exceed the total")
    if shape.quantized_params and not recipe.quant:
        raise ValueError(f"recipe {recipe.precision} quantises nothing: pass quantized_params=0")

    weight = recipe.weight_dtype.itemsize
    trainable_weight = FP32 if recipe.lora else weight  # peft creates LoRA adapters in fp32
    frozen_weight = FP32 if recipe.quant else weight  # peft upcasts the rest of a k-bit base
    quant_per = _quantized_bytes(recipe.quant) if recipe.quant else 0.0
    # layers a half-precision load kept in fp32 train there (a pure half recipe trains
    # every weight): 2 more bytes each in the weight, its gradient and AdamW's m and v
    kept = shape.fp32_kept_params * (FP32 - weight) if weight < FP32 and not recipe.quant else 0
    params = round(shape.quantized_params * quant_per + frozen * frozen_weight
                   + shape.trainable_params * trainable_weight) + kept
    quant_state = _quant_state_bytes(shape, recipe, device_type)
    grads = shape.trainable_params * trainable_weight + kept
    if optimizer == "adamw":
        opt, opt_text = 2 * grads, f"AdamW m+v: 2·{grads:,} = {2 * grads:,} B"
    elif optimizer == "adamw8bit":
        opt, opt_text = _adam8_bytes(shape.trainable_sizes)
    elif optimizer in TORCHAO_STATE or optimizer == "adamw-bf16-sr":
        opt, opt_text = _torchao_bytes(optimizer, shape.trainable_sizes, trainable_weight,
                                       device_type)
    else:
        opt, opt_text = 0, "SGD (no momentum): no state"
    # autocast copies the weights it casts; a quantised base is dequantised per call
    # instead (freed at once), so only its adapters and the other frozen weights count.
    # Checkpointed layers save nothing, their copies included: the head's copy remains.
    # Layers converted to float8/MX keep no copy: only the rest (the LM head, shapes the
    # formats cannot take, a ":keep-..." recipe's kept layers) are autocast's to copy.
    copies_of = shape.matmul_params - shape.quantized_params - shape.converted_matmul_params
    if grad_checkpointing:
        copies_of = _outer_matmul(shape)
    full_weights = recipe.weight_dtype.itemsize == FP32 or recipe.quant
    copies = 2 * copies_of if recipe.autocast_dtype is not None and full_weights else 0
    act = _activations(shape, recipe, batch_size, seq_len, grad_checkpointing, device_type)
    saved = act.total
    inputs = batch_size * seq_len * 8 * (3 if shape.dims.get("encoder_decoder") else 2)
    tokens = batch_size * seq_len
    # backward's start: the loss's gradient of the logits and of their log-softmax, in fp32
    # under autocast (cross-entropy runs in fp32) or where the loss upcasts the logits
    logits_dtype = FP32 if shape.loss_in_fp32 or recipe.autocast_dtype else _act_bytes(recipe)
    logits_grad = 2 * tokens * shape.dims["vocab"] * logits_dtype
    held = [("params", params), ("buffers", shape.buffers_bytes),
            ("quantisation state", quant_state), ("optimizer", opt), ("inputs", inputs)]
    # each phase as its terms, so that the text's figures add up to the phase's
    terms = {"backward start": [*held, ("weight copies", copies), ("activations", saved),
                                ("logits and log-softmax gradients", logits_grad)]}
    if grad_checkpointing:
        terms.update(_reruns(shape, recipe, act, [*held, ("weight copies", copies)],
                             batch_size, seq_len, trainable_weight))
    largest = max(shape.trainable_sizes, default=0) * trainable_weight
    # torch's AdamW on the CPU: one tensor's scratch at a time (two of the largest); on a
    # GPU trials run it fused (engine.models.optimizers.make_optimizer), one kernel that makes none;
    # the other optimisers' GPU steps hold every gradient's worth at once
    if optimizer == "sgd" or (optimizer == "adamw" and device_type == "cuda"):
        scratch = 0
    else:
        scratch = grads if device_type == "cuda" else 2 * largest
    if shape.tied_embedding_params:
        # backward's end: every gradient (the head's share of the tied table among them),
        # the lookup's dense gradient of the table and their sum, before it replaces the
        # first (GPT-2 on the H200 and the CPU: two tables beside every gradient)
        tied = 2 * shape.tied_embedding_params * trainable_weight
        terms["backward end"] = [*held, ("grads", grads), ("tied embedding gradients", tied)]
    terms["optimiser step"] = [*held, ("grads", grads), ("optimiser scratch", scratch)]
    phases = {name: sum(b for _, b in parts) for name, parts in terms.items()}
    total = max(phases.values())
    peak_phase = max(phases, key=phases.get)
    at_peak = dict.fromkeys(_TERM_CATEGORY.values(), 0)
    for label, b in terms[peak_phase]:
        at_peak[_TERM_CATEGORY[label]] += b

    per = {"weights": float(trainable_weight), "grads": float(trainable_weight),
           "optimizer": opt / shape.trainable_params if shape.trainable_params else 0.0,
           "static": (params + grads + opt) / shape.total_params}
    if recipe.quant:
        per["quantized_weights"] = quant_per
        per["frozen_weights"] = float(frozen_weight)
    lines = [
        f"{recipe.precision} with {optimizer} (total {shape.total_params:,} params, "
        f"{shape.trainable_params:,} trainable, {shape.quantized_params:,} quantised)",
        f"params {params:,} B + buffers {shape.buffers_bytes:,} B + quantisation state "
        f"{quant_state:,} B; grads {grads:,} B; optimizer {opt_text}",
        f"activations ({act.method}): {act.formula}",
        f"weight copies: 2 B x {copies_of:,} matmul weights = {copies:,} B"
        + (f" ({shape.converted_matmul_params:,} weights of float8/MX layers keep none: "
           "torchao saves the fp32 weight and casts it again in backward)"
           if shape.converted_matmul_params and not grad_checkpointing else "") if copies
        else "weight copies: none (no autocast over fp32 weights)",
        *(f"{name} = " + " + ".join(f"{label} {b:,} B" for label, b in parts if b)
          + f" = {phases[name]:,} B" for name, parts in terms.items()),
        f"peak: the largest phase, {peak_phase}: {total:,} B",
    ]
    return PredictedMemory(
        params_bytes=params,
        master_bytes=0,  # no recipe keeps a separate copy: AMP's master is the fp32 weights
        grads_bytes=grads,
        optimizer_bytes=opt,
        activations_bytes=saved,
        total_bytes=total,
        bytes_per_param=per,
        formula="\n".join(lines),
        buffers_bytes=shape.buffers_bytes,
        quant_state_bytes=quant_state,
        weight_copies_bytes=copies,
        activations_method=act.method,
        inputs_bytes=inputs,
        temporaries_bytes=logits_grad,
        peak_phase=peak_phase,
        at_peak_bytes=at_peak,
    )


def with_errors(predicted: PredictedMemory, measured: MemoryBreakdown) -> PredictedMemory:
    """``predicted`` with error_pct = 100·(predicted − measured)/measured per category.

    Persistent categories compare with the peak; gradients with what was held when the
    optimiser step began, activations and weight copies with what was held when backward
    began (what the forward saved). A category measured as 0 or not at all has none.
    """
    errors = {}
    predicted_values = {"params": predicted.params_bytes, "buffers": predicted.buffers_bytes,
                        "quant_state": predicted.quant_state_bytes,
                        "optimizer": predicted.optimizer_bytes, "grads": predicted.grads_bytes,
                        "activations": predicted.activations_bytes,
                        "weight_copies": predicted.weight_copies_bytes,
                        "total": predicted.total_bytes}
    for category, (name, phase) in _MEASURED.items():
        if phase is None:
            actual = getattr(measured, name)
        else:
            actual = (measured.at_phase_start_bytes or {}).get(phase, {}).get(name)
        if actual:
            errors[category] = 100.0 * (predicted_values[category] - actual) / actual
    return dataclasses.replace(predicted, error_pct=errors)
