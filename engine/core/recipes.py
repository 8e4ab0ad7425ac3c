"""One recipe per precision: how weights are stored, what autocast runs, what scales.

A recipe is data; ``engine.models.load`` loads a model by it and ``engine.run.trial`` trains
by it. ``peak_dtype`` names the column of the peak FLOP/s table that MFU divides by:
the dtype the recipe's matmuls actually run in.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from engine.core.config import PRECISIONS, parse_precisions, split_keep, split_label


@dataclass(frozen=True)
class Recipe:
    precision: str
    weight_dtype: torch.dtype  # dtype of the (non-quantised) weights as loaded
    autocast_dtype: torch.dtype | None  # None: no autocast region
    use_scaler: bool  # GradScaler (dynamic loss scaling)
    quant: str | None  # None, "int8" or "nf4" (bitsandbytes)
    lora: bool  # base frozen, peft LoRA adapters trained
    fp8: bool  # torchao float8 training
    tf32: bool  # allow TF32 matmuls
    peak_dtype: str  # key into resources/peak_flops.json
    master_weights: bool  # fp32 master copy kept by the optimiser path
    description: str  # what runs on a GPU
    # what runs on the CPU where a library takes another path there (None: the same)
    cpu_description: str | None = None
    # torchao Float8LinearRecipeName value the fp8 recipes convert with (None: no float8)
    float8_recipe: str | None = None
    optimizer: str | None = None  # a "+optim" label's own optimiser; None: the run's --optimizer
    mx: str | None = None  # block-scaled format its Linear layers train in: "mxfp8", "nvfp4"
    # a ":keep-..." label's layers left in bf16 (engine/models/per_layer.py)
    keep_high: str | None = None
    # FSDP2 all-gathers float8 Linear weights in float8 (torchao), scales precomputed per step
    fsdp_float8_all_gather: bool = False


_F32, _F16, _BF16 = torch.float32, torch.float16, torch.bfloat16
_INT8_COMMON = ("peft's prepare_model_for_kbit_training casts embeddings, LayerNorms and the "
                "LM head to fp32; LoRA adapters are fp32, run under fp16 autocast; GradScaler "
                "scales the loss so fp16 activation gradients do not flush to zero")

RECIPES: dict[str, Recipe] = {
    r.precision: r
    for r in (
        Recipe("fp32", _F32, None, False, None, False, False, False, "fp32", False,
               "fp32 weights and math; TF32 off"),
        Recipe("tf32", _F32, None, False, None, False, False, True, "tf32", False,
               "fp32 weights; matmuls in TF32 on Tensor Cores"),
        Recipe("fp16-amp", _F32, _F16, True, None, False, False, False, "fp16", True,
               "fp32 master weights, autocast fp16, GradScaler"),
        Recipe("bf16-amp", _F32, _BF16, False, None, False, False, False, "bf16", True,
               "fp32 master weights, autocast bf16, no loss scaling"),
        Recipe("fp16", _F16, None, True, None, False, False, False, "fp16", False,
               "pure fp16 weights, gradients and optimiser state, GradScaler"),
        Recipe("bf16", _BF16, None, False, None, False, False, False, "bf16", False,
               "pure bf16 weights, gradients and optimiser state"),
        Recipe("int8", _F16, _F16, True, "int8", True, False, False, "fp16", False,
               "bitsandbytes LLM.int8 frozen base: int8 weights; forward casts each input "
               "to fp16, quantises it to int8 and runs an int8 matmul, outlier columns (|x| >= 6) "
               "in the input's dtype; backward multiplies by the dequantised weight in the "
               "input's dtype (fp32 after the fp32 LayerNorms, fp16 elsewhere). " + _INT8_COMMON,
               # bitsandbytes 0.50 autograd.matmul: training on cpu/xpu takes MatMul8bitFp
               "bitsandbytes LLM.int8 frozen base: int8 weights; on the CPU bitsandbytes runs "
               "no int8 matmul: forward and backward dequantise each int8 weight (x row scale "
               "/ 127) to the input's dtype and multiply in it, fp16 under autocast and fp32 "
               "after the fp32 LayerNorms. " + _INT8_COMMON),
        Recipe("nf4", _BF16, _BF16, False, "nf4", True, False, False, "bf16", False,
               "bitsandbytes 4-bit NF4 frozen base dequantised to bf16 for each matmul "
               "(QLoRA); peft's prepare_model_for_kbit_training casts embeddings, LayerNorms "
               "and the LM head to fp32; LoRA adapters fp32 under bf16 autocast"),
        Recipe("fp8", _F32, _BF16, False, None, False, True, False, "fp8", True,
               "torchao float8 training of Linear layers (dynamic tensorwise scaling), bf16 "
               "autocast elsewhere; compiled with torch.compile by default (eager float8 is "
               "several times slower and not representative)", float8_recipe="tensorwise"),
        Recipe("fp8-rowwise", _F32, _BF16, False, None, False, True, False, "fp8", True,
               "torchao float8 training of Linear layers with rowwise (axiswise) scaling: one "
               "scale per row of each operand, rounded to a power of 2, for all three GEMMs; "
               "bf16 autocast elsewhere; compiled with torch.compile by default",
               float8_recipe="rowwise"),
        Recipe("fp8-rowwise-gw-hp", _F32, _BF16, False, None, False, True, False, "fp8", True,
               "torchao float8 training of Linear layers with rowwise scaling of the output "
               "GEMM and of the gradient in the input-gradient GEMM (its weight tensorwise), "
               "the weight-gradient GEMM kept in high precision (bf16); bf16 autocast "
               "elsewhere; compiled with torch.compile by default",
               float8_recipe="rowwise_with_gw_hp"),
        Recipe("mxfp8", _F32, _BF16, False, None, False, False, False, "mxfp8", True,
               "torchao MXFP8 training of Linear layers (MXFP8TrainingOpConfig, recipe "
               "mxfp8_rceil): input, weight and gradient cast to float8 e4m3 in 32-element "
               "blocks with e8m0 (power-of-2) scales rounded up (RCEIL) for all three GEMMs; "
               "bf16 autocast elsewhere",
               cpu_description="torchao MXFP8 training of Linear layers with the emulated "
               "kernel preference (recipe mxfp8_emulated_rceil): operands quantised to e4m3 "
               "in 32-element blocks with RCEIL e8m0 scales, dequantised and multiplied in "
               "fp32; bf16 autocast elsewhere", mx="mxfp8"),
        Recipe("nvfp4", _F32, _BF16, False, None, False, False, False, "nvfp4", True,
               "NVFP4 training of Linear layers: e2m1 elements in 16-element blocks with an "
               "e4m3 scale each and one fp32 scale per tensor, random Hadamard transform and "
               "stochastic rounding of gradients; torchao's NVFP4TrainingConfig (Triton "
               "kernels, fp4 GEMMs) on compute capability 10.x, elsewhere AmpScope's "
               "emulation of Transformer Engine's reference recipe (16x16 weight blocks, "
               "GEMMs on the dequantised operands in fp32); bf16 autocast elsewhere",
               mx="nvfp4"),
        Recipe("fp8-fsdp-ag", _F32, _BF16, False, None, False, True, False, "fp8", True,
               "fp8 (tensorwise) under FSDP2 with torchao's float8 all-gather: each float8 "
               "Linear weight is cast to float8 on its shard before the all-gather, so it "
               "crosses the wire in 1 byte per element instead of bf16's 2; the weight scales "
               "are precomputed after each optimizer step in one all-reduce "
               "(precompute_float8_dynamic_scale_for_fsdp)", float8_recipe="tensorwise",
               fsdp_float8_all_gather=True),
    )
}

assert tuple(RECIPES) == PRECISIONS


def float8_config(rec: Recipe):
    """torchao's ``Float8LinearConfig`` for an fp8 recipe, built from its recipe name."""
    from torchao.float8 import Float8LinearConfig

    config = Float8LinearConfig.from_recipe_name(rec.float8_recipe)
    if rec.fsdp_float8_all_gather:
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    return config


def recipe(precision: str) -> Recipe:
    """The recipe of a trial label; ``"fp32+adamw8bit"`` is fp32's, with its own optimiser,
    ``"fp8:keep-attn"`` fp8's with its attention layers left in bf16."""
    if "+" in precision or ":" in precision:
        parse_precisions([precision])  # the ValueError that names the choices
        name, optim, _ = split_label(precision)
        name, keep = split_keep(name)
        base = RECIPES[name]
        text = base.description
        if keep:
            text = f"{text}; {KEEP_TEXT[keep]}"
        return dataclasses.replace(base, precision=precision, optimizer=optim, keep_high=keep,
                                   description=text)
    try:
        return RECIPES[precision]
    except KeyError:
        raise ValueError(
            f"unknown precision '{precision}': choose from {', '.join(PRECISIONS)}"
        ) from None


# what a ":keep-..." suffix leaves out of the conversion (engine/models/per_layer.py finds them)
KEEP_TEXT = {
    "keep-ends": "the first and last transformer blocks (beside the embeddings and the LM "
                 "head) keep their Linear layers in bf16",
    "keep-attn": "the attention blocks keep their Linear layers (q/k/v and output "
                 "projections) in bf16; the MLPs run fp8",
    "auto": "only the Linear layers the payoff model predicts to pay at the trial's tokens "
            "per micro-batch on the card (--card, else the GPU it runs on) run fp8; the "
            "rest stay in bf16",
}


def compiles(rec: Recipe, compile_flag: bool, warmup: int, verdict) -> bool:
    """Whether a trial's steps run under torch.compile. float8 is only fast compiled, and
    compiling needs a warm-up step to land in; emulated float8 (the CPU, GPUs before sm89)
    is not fast either way, so compiling it would only cost minutes. ``verdict`` is the
    device's gating verdict for the recipe (``None``: not known)."""
    emulated = verdict is not None and verdict.support == "emulated"
    return compile_flag or (rec.fp8 and warmup >= 1 and not emulated)


MX_BLOCK = 32  # MXFP8's block: every blocked (inner) dimension is a whole number of them
# torchao 0.18 nvfp4_training: nvfp4_mm_triton requires M, K and N divisible by 128
MX_MULTIPLE = {"mxfp8": MX_BLOCK, "nvfp4": 128}


def mx_training_recipe(native: bool) -> str:
    """torchao's MXFP8TrainingRecipe value: its CUTLASS/Triton kernels where the GPU has
    block-scaled fp8 (compute capability 10.x), the emulated kernel preference elsewhere."""
    return "mxfp8_rceil" if native else "mxfp8_emulated_rceil"


def mx_shape_reason(rec: Recipe, tokens_per_micro_batch: int, hidden: int) -> str | None:
    """Why MXFP8/NVFP4 training cannot run these shapes (the weight-gradient GEMM blocks
    the tokens of a micro-batch), or ``None``."""
    return _shape_reason(rec.mx, MX_MULTIPLE[rec.mx], tokens_per_micro_batch, hidden)


FP8_MULTIPLE = 16  # float8 GEMMs (torch._scaled_mm) need every dimension divisible by 16


def fp8_shape_reason(tokens_per_micro_batch: int, hidden: int) -> str | None:
    """Why float8 training cannot run these shapes, or ``None`` when it can.

    The tokens of a micro-batch are the inner dimension of the weight-gradient GEMM;
    the model width is a dimension of every converted Linear layer.
    """
    return _shape_reason("float8", FP8_MULTIPLE, tokens_per_micro_batch, hidden)


def _shape_reason(name: str, multiple: int, tokens: int, hidden: int) -> str | None:
    bad = []
    if tokens % multiple:
        bad.append(f"tokens per micro-batch (batch x sequence = {tokens})")
    if hidden % multiple:
        bad.append(f"the model width ({hidden})")
    if not bad:
        return None
    return (f"{name} GEMMs need every dimension to be a multiple of {multiple}, and "
            f"{' and '.join(bad)} {'is' if len(bad) == 1 else 'are'} not: pick a batch size "
            f"and sequence length whose product is a multiple of {multiple}")


# torchao 0.18 torchao/optim/adam.py: state tensors under 4096 elements (or not a whole
# number of blocks) stay unquantised in the weight's dtype; each step is torch.compile'd
OPTIMIZER_TEXT = {
    "adamw8bit-ao": "torchao AdamW8bit: m and v as 8-bit codes with an fp32 scale per "
                    "256-element block, step compiled with torch.compile",
    "adamw4bit": "torchao AdamW4bit: m and v as 4-bit codes with an fp32 scale per "
                 "128-element block, step compiled with torch.compile",
    "adamw-fp8": "torchao AdamWFp8: m and v in float8 e4m3 with an fp32 scale per 256-element "
                 "block, step compiled with torch.compile",
    "adamw-bf16-sr": "AdamW with bf16 m and v (torchao's _AdamW step, compiled): bf16 weights "
                     "are updated with stochastic rounding, fp32 weights exactly",
}


def run_description(rec: Recipe, device_type: str, optimizer: str,
                    compiled: bool | None) -> str:
    """The recipe as it ran: its text, the optimiser implementation and compilation.

    ``compiled`` is ``None`` for a trial that never reached its training steps.
    """
    on_cpu = device_type == "cpu" and rec.cpu_description
    parts = [rec.cpu_description if on_cpu else rec.description]
    if optimizer in ("adamw", "sgd") and device_type == "cuda":
        name = "AdamW" if optimizer == "adamw" else "SGD"
        parts.append(f"torch {name} with fused=True (one kernel, and under a GradScaler the "
                     "inf check stays on the GPU: no host sync mid-step)")
    elif optimizer == "adamw8bit":
        parts.append("bitsandbytes AdamW8bit (a GradScaler reads its inf check on the host)")
    elif optimizer in OPTIMIZER_TEXT:
        parts.append(OPTIMIZER_TEXT[optimizer])
    if rec.fp8 and compiled is False:
        parts.append("this trial ran eagerly (float8 is fast only compiled): its fp8 speed "
                     "is NOT representative")
    elif compiled and not rec.fp8:
        parts.append("compiled with torch.compile")
    return "; ".join(parts)


def library_sync_notes(rec: Recipe, task: str, compiled: bool, optimizer: str,
                       device_type: str) -> list[str]:
    """Host syncs inside libraries that a trial's GPU step times include.

    Each one stops the CPU from queuing work ahead of the GPU, so the GPU idles while
    the CPU catches up; the trials they name pay for it, the others do not.
    """
    if device_type != "cuda":
        return []
    notes = []
    if task == "causal-lm" and not compiled:
        notes.append("transformers' create_causal_mask checks the position ids for packed "
                     "sequences with a Python `if` on `.all()` "
                     "(masking_utils.find_packed_sequence_indices): one host sync per "
                     "forward, in every eager causal-LM trial")
    if rec.quant == "int8":
        notes.append("bitsandbytes LLM.int8 finds outlier columns with `if outliers.any()` "
                     "and `torch.argwhere` (int8_vectorwise_quant): host syncs in every int8 "
                     "layer's forward, included in int8 step times")
    if optimizer == "adamw8bit" and rec.use_scaler:
        notes.append("GradScaler reads its inf check on the host before a bitsandbytes "
                     "AdamW8bit step (only torch's fused optimisers take it as a tensor): one "
                     "host sync per step")
    return notes


def _fp32_backends() -> tuple:
    return (torch.backends.cuda.matmul, torch.backends.cudnn.conv, torch.backends.cudnn.rnn)


def set_fp32_precision(rec: Recipe) -> list[str]:
    """TF32 for the tf32 recipe only (IEEE fp32 otherwise) on cuBLAS and cuDNN.

    Only the ``fp32_precision`` API is used: mixing it with the older ``allow_tf32``
    flags or ``set_float32_matmul_precision`` makes inductor raise. Returns the modes
    it replaced.
    """
    mode = "tf32" if rec.tf32 else "ieee"
    before = [b.fp32_precision for b in _fp32_backends()]
    for backend in _fp32_backends():
        backend.fp32_precision = mode
    return before


@contextmanager
def fp32_precision(rec: Recipe):
    """``set_fp32_precision`` for the ``with`` block, restored after (the setting is global)."""
    before = set_fp32_precision(rec)
    try:
        yield
    finally:
        for backend, value in zip(_fp32_backends(), before):
            backend.fp32_precision = value


def autocast_for(rec: Recipe, device: torch.device):
    """The recipe's autocast region on ``device`` (a no-op for recipes without one)."""
    if rec.autocast_dtype is None:
        return nullcontext()
    return torch.autocast(device.type, dtype=rec.autocast_dtype)
