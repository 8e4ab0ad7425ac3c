"""Loading a model by a recipe, from a source (engine.models.source: preset, local folder,
hub id).

Quantised recipes (int8, nf4) go through transformers' ``from_pretrained`` with a
``BitsAndBytesConfig``, the real loading path. A preset or a folder without weights
has no checkpoint to load, so its random-init model is saved to a temporary folder
first and loaded back from there.
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from engine.core.recipes import MX_BLOCK, MX_MULTIPLE, Recipe, float8_config, mx_training_recipe
from engine.core.recipes import recipe as get_recipe
from engine.models.hf import model_class
from engine.models.per_layer import kept_high
from engine.models.presets import did_you_mean, get_preset, presets
from engine.models.source import ModelSource, resolve_source  # callers import them here too

TASKS = ("causal-lm", "masked-lm", "seq2seq-lm")
SUPPORTED_LINE = (
    "AmpScope trains text models with a language-modelling head: decoder-only (causal LM, "
    "e.g. GPT-2, Llama), encoder-only (masked LM, e.g. BERT) and encoder-decoder "
    "(seq2seq LM, e.g. T5, BART)"
)


def task_of(config) -> str:
    """The training head a config gets. Encoder-decoders first: BART also has a CausalLM
    class, its decoder alone, which would silently drop the encoder. Encoders (BERT)
    that also have a causal-LM variant train their masked-LM head."""
    from transformers.models.auto import modeling_auto as auto

    kind = config.model_type
    archs = getattr(config, "architectures", None) or []
    remote = bool(getattr(config, "auto_map", None))  # remote code names its own classes
    if getattr(config, "is_encoder_decoder", False) and (
            kind in auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES or remote):
        return "seq2seq-lm"
    if any(a.endswith("ForMaskedLM") for a in archs):
        return "masked-lm"
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        return "causal-lm"
    if kind in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "masked-lm"
    if kind in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or remote:
        return "causal-lm"
    raise ValueError(f"'{kind}' models have no language-modelling head to train: "
                     f"{SUPPORTED_LINE}")


def load_config(source: ModelSource, trust_remote_code: bool = False):
    """The transformers config of a source, and its task. Hub ids come from the cache."""
    from engine.models.hf import auto_config

    AutoConfig = auto_config()  # noqa: N806 (the class, as transformers names it)

    if source.kind == "preset":
        preset = get_preset(source.ref)
        return preset.build_config(), preset.task
    if source.kind == "folder":
        config = AutoConfig.from_pretrained(source.ref, trust_remote_code=trust_remote_code)
        return config, task_of(config)
    try:
        config = AutoConfig.from_pretrained(
            source.ref, trust_remote_code=trust_remote_code, local_files_only=True
        )
    except Exception as exc:
        if "trust_remote_code" in str(exc):
            raise ValueError(
                f"'{source.ref}' runs its own code: turn on trust remote code "
                "(--trust-remote-code) only if you trust its authors"
            ) from None
        names = ", ".join(p.name for p in presets())
        raise ValueError(
            f"'{source.ref}' is not a preset, a folder, or a hub model in the local cache "
            f"(this machine is offline to the hub): download it first with "
            f"'hf download {source.ref}', pass a local folder, or pick a preset ({names})"
            f"{did_you_mean(source.ref)}"
        ) from None
    return config, task_of(config)


def max_positions(config) -> int | None:
    for name in ("n_positions", "max_position_embeddings"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def vocab_size(config) -> int:
    return int(config.vocab_size)


def dims(config) -> dict:
    """Layers, width, heads, head size and vocabulary, whatever the config calls them.

    ``attention_width`` is heads x head_dim, what attention multiplies over; it differs
    from ``hidden`` where a config sets ``head_dim`` (some Llama-style models, T5's
    ``d_kv``). ``kv_heads`` < ``n_heads`` is grouped-query attention. An encoder-decoder
    has ``encoder_layers`` and ``decoder_layers`` (``n_layers`` is their sum).
    """

    def first(*names):
        return next(
            (getattr(config, n) for n in names if getattr(config, n, None) is not None), None
        )

    hidden = int(first("hidden_size", "n_embd", "d_model"))
    n_heads = int(first("num_attention_heads", "n_head"))
    head_dim = first("head_dim", "d_kv")
    head_dim = int(head_dim) if isinstance(head_dim, int) else hidden // n_heads
    out = {
        "n_layers": int(first("num_hidden_layers", "n_layer")),
        "hidden": hidden,
        "n_heads": n_heads,
        "head_dim": head_dim,
        "kv_heads": int(first("num_key_value_heads", "num_kv_heads") or n_heads),
        "attention_width": n_heads * head_dim,
        "intermediate": int(first("intermediate_size", "n_inner", "ffn_dim", "d_ff",
                                  "encoder_ffn_dim") or 4 * hidden),
        "vocab": vocab_size(config),
        "encoder_decoder": bool(getattr(config, "is_encoder_decoder", False)),
    }
    if out["encoder_decoder"]:
        out["encoder_layers"] = int(first("encoder_layers", "num_layers", "num_hidden_layers"))
        out["decoder_layers"] = int(first("decoder_layers", "num_decoder_layers")
                                    or out["encoder_layers"])
        out["n_layers"] = out["encoder_layers"] + out["decoder_layers"]
    return out


def footprint_note(config, model: nn.Module) -> str:
    """Explain why this footprint differs from what older transformers printed."""
    if config.model_type != "gpt2":
        return "parameters + buffers, as transformers' get_memory_footprint() counts them"
    buffers = {name.rsplit(".", 1)[-1] for name, _ in model.named_buffers()}
    mask_mib = config.n_layer * config.n_positions**2 / 2**20
    if "bias" in buffers:
        return "parameters + buffers, including GPT-2's causal-mask buffers"
    return (
        "parameters + buffers (transformers' get_memory_footprint()). Older transformers "
        f"releases also held GPT-2's causal mask as a bool buffer per layer "
        f"({config.n_layer} x {config.n_positions}^2 bytes = {mask_mib:.2f} MiB), so they "
        f"printed {mask_mib:.2f} MiB more"
    )


@dataclass
class LoadedModel:
    model: nn.Module
    config: object
    task: str
    source: ModelSource
    footprint_bytes: int
    footprint_note: str
    lora: dict | None = None  # the LoRA configuration trained, when the recipe trains adapters


@contextmanager
def _seeded(seed: int):
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.random.set_rng_state(state)


def _bnb_config(recipe: Recipe):
    from transformers import BitsAndBytesConfig

    if recipe.quant == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=recipe.autocast_dtype,
        bnb_4bit_use_double_quant=False,
    )


def _from_pretrained(ref: str, config, task: str, recipe: Recipe, device: torch.device,
                     trust: bool, local_only: bool):
    # the caller's config (use_cache off), not the one saved beside the weights
    kwargs = {"config": config, "dtype": recipe.weight_dtype, "trust_remote_code": trust}
    if local_only:
        kwargs["local_files_only"] = True
    if recipe.quant:
        kwargs["quantization_config"] = _bnb_config(recipe)
        kwargs["device_map"] = {"": device.index if device.type == "cuda" else "cpu"}
        return model_class(task).from_pretrained(ref, **kwargs)
    return model_class(task).from_pretrained(ref, **kwargs).to(device)


def random_init(config, task: str, dtype: torch.dtype, device: torch.device, seed: int,
                trust: bool):
    # drawn on the CPU, then moved: the GPU's generator would give each dtype and device
    # different weights, and "loss vs fp32" needs every recipe to start from the same ones
    with _seeded(seed), torch.device("cpu"):
        net = model_class(task).from_config(config, dtype=dtype, trust_remote_code=trust)
    # no move to the CPU: under engine.run.plan's fake tensors a move swaps every parameter
    return net if device.type == "cpu" else net.to(device)


def conv1d_to_linear(model: nn.Module) -> int:
    """Swap GPT-2's Conv1D layers for nn.Linear (same math, transposed weight).

    torchao's float8 training converts nn.Linear only; without this GPT-2 would run
    no matmul in fp8. Returns how many layers were swapped.
    """
    from transformers.pytorch_utils import Conv1D

    swaps = [(name, mod) for name, mod in model.named_modules() if isinstance(mod, Conv1D)]
    for name, conv in swaps:
        in_f, out_f = conv.weight.shape
        # built on the meta device, so no initial draw from torch's global RNG shifts the
        # dropout masks of a converted trial away from the unconverted trials'
        linear = nn.Linear(in_f, out_f, device="meta", dtype=conv.weight.dtype)
        linear.weight = nn.Parameter(conv.weight.detach().t().contiguous(),
                                     requires_grad=conv.weight.requires_grad)
        linear.bias = nn.Parameter(conv.bias.detach().clone(),
                                   requires_grad=conv.bias.requires_grad)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, linear)
    return len(swaps)


def _fp8_filter(module: nn.Module, fqn: str) -> bool:
    # float8 GEMMs need both dims divisible by 16; the tied lm_head stays in bf16.
    return (
        isinstance(module, nn.Linear)
        and module.in_features % 16 == 0
        and module.out_features % 16 == 0
        and "lm_head" not in fqn
    )


def _cast_float8_inputs_under_cpu_autocast(model: nn.Module) -> None:
    """Give float8 layers on the CPU the input cast they get under CUDA autocast.

    torchao's Float8Linear casts its input to the autocast dtype only when CUDA autocast
    is on; under CPU autocast the input stays fp32 while the gradient arrives in bf16,
    and a high-precision weight-gradient GEMM then multiplies mismatched dtypes.
    """
    from torchao.float8.float8_linear import Float8Linear

    def cast(_module, args):
        if torch.is_autocast_enabled("cpu"):
            return (args[0].to(torch.get_autocast_dtype("cpu")), *args[1:])
        return None

    for module in model.modules():
        if isinstance(module, Float8Linear):
            module.register_forward_pre_hook(cast)


def _mx_filter(multiple: int):
    """Linear layers whose both dimensions are whole multiples; the tied lm_head stays bf16."""
    def keep(module: nn.Module, fqn: str) -> bool:
        return (isinstance(module, nn.Linear) and module.in_features % multiple == 0
                and module.out_features % multiple == 0 and "lm_head" not in fqn)
    return keep


def _mx_native(device: torch.device) -> bool:
    from engine.measure import gating

    if device.type != "cuda":
        return False
    dev = gating.DeviceDescription.from_properties(torch.cuda.get_device_properties(device))
    return dev.kind == "cuda" and (dev.compute_capability or (0, 0))[0] == 10


def _emulated_mx_dtypes(module: nn.Module, args):
    """Emulated MX multiplies the dequantised operands in their own dtypes, which must
    match: the input is cast to the weight's (fp32, where the GEMM accumulates anyway)."""
    return (args[0].to(module.weight.dtype), *args[1:])


def _mx_output_dtype(module: nn.Module, args, output):
    # the native GEMM writes bf16 (MXFP8TrainingOpConfig.out_dtype); so does the emulation
    if torch.is_autocast_enabled(output.device.type):
        return output.to(torch.get_autocast_dtype(output.device.type))
    return None


def convert_mx(model: nn.Module, recipe: Recipe, device: torch.device, seed: int = 0) -> int:
    """Swap Linear layers for torchao's block-scaled training layers; returns how many.

    MXFP8 takes its fields from ``MXFP8TrainingOpConfig.from_recipe`` and builds
    ``MXFP8Linear`` layers: the config's own weight-wrapper path (quantize_) drops
    F.linear's bias in torchao 0.18 (MXFP8TrainingWeightWrapperTensor's linear override
    returns the product alone), and GPT-2's layers have biases. NVFP4 off compute capability
    10.x is AmpScope's emulation (its stochastic rounding seeded with ``seed``), which needs
    only 16-element blocks, not torchao's Triton kernels' multiples of 128.
    """
    conv1d_to_linear(model)
    if recipe.mx == "nvfp4" and not _mx_native(device):
        from engine.measure import nvfp4_linear

        return nvfp4_linear.convert(model, _mx_filter(nvfp4_linear.BLOCK), seed)
    keep = _mx_filter(MX_MULTIPLE[recipe.mx])
    swaps = [(n, m) for n, m in model.named_modules() if keep(m, n)]
    if recipe.mx == "nvfp4":
        from torchao.prototype.moe_training.nvfp4_training.nvfp4_training import (
            NVFP4TrainingConfig,
        )
        from torchao.quantization import quantize_

        quantize_(model, NVFP4TrainingConfig(), filter_fn=keep)
        return len(swaps)
    from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe
    from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    cfg = MXFP8TrainingOpConfig.from_recipe(
        MXFP8TrainingRecipe(mx_training_recipe(_mx_native(device))))
    emulated = cfg.kernel_preference == KernelPreference.EMULATED
    for name, linear in swaps:
        mx = MXFP8Linear(linear.in_features, linear.out_features, linear.bias is not None,
                         kernel_preference=cfg.kernel_preference,
                         scale_calculation_mode=cfg.scale_calculation_mode,
                         wgrad_with_hp=cfg.wgrad_with_hp, device="meta")
        mx.weight, mx.bias = linear.weight, linear.bias
        if emulated:
            mx.register_forward_pre_hook(_emulated_mx_dtypes)
            mx.register_forward_hook(_mx_output_dtype)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, mx)
    return len(swaps)


def mx_scaling(model: nn.Module) -> str | None:
    """What the block-scaled layers ran, read from the layers (``None``: none converted)."""
    layers = [m for m in model.modules() if type(m).__name__ in ("MXFP8Linear", "NVFP4Linear",
                                                                 "EmulatedNVFP4Linear")]
    if not layers:
        return None
    first = layers[0]
    if type(first).__name__ == "EmulatedNVFP4Linear":
        return (f"NVFP4 training of {len(layers)} Linear layers, emulated (AmpScope's "
                "EmulatedNVFP4Linear after Transformer Engine 2.20's reference NVFP4 recipe, "
                "torchao 0.18's NVFP4Tensor quantiser): e2m1 in 1x16 blocks with e4m3 scales "
                "and an fp32 tensor scale, weights in 16x16 blocks, a random Hadamard "
                "transform on the weight-gradient GEMM's inputs, gradients stochastically "
                "rounded; GEMMs multiply the dequantised operands in fp32. "
                + _nvfp4_copies(layers))
    if type(first).__name__ == "NVFP4Linear":
        return (f"NVFP4 training of {len(layers)} Linear layers (torchao NVFP4Linear, "
                f"kernel preference {first.kernel_preference.value})")
    return (f"MXFP8 training of {len(layers)} Linear layers (torchao MXFP8Linear): e4m3 "
            f"elements in blocks of {MX_BLOCK}, e8m0 scales by "
            f"{first.scale_calculation_mode.value.upper()}, kernel preference "
            f"{first.kernel_preference.value}, weight gradient "
            f"{'in high precision' if first.wgrad_with_hp else 'in MXFP8'}")


def _nvfp4_copies(layers: list[nn.Module]) -> str:
    """The weight copies the emulation keeps for backward beside the ones a card would."""
    n = sum(m.weight.numel() for m in layers)
    emulated, card = 4 * n, n // 2 + n // 16  # fp32 vs e2m1 + one e4m3 scale per 16
    return (f"Memory is the emulation's: its dequantised weight copies hold "
            f"{emulated / 2**20:.2f} MiB (fp32) where a card's NVFP4 copies would hold "
            f"{card / 2**20:.2f} MiB (4-bit elements, an e4m3 scale per 16; computed, "
            "not measured)")


# Float8LinearConfig cast configs by the GEMM that uses them, as torchao names the fields
_FLOAT8_CASTS = (
    ("output", (("input", "cast_config_input"), ("weight", "cast_config_weight"))),
    ("grad-input", (("grad_output", "cast_config_grad_output"),
                    ("weight", "cast_config_weight_for_grad_input"))),
    ("grad-weight", (("input", "cast_config_input_for_grad_weight"),
                     ("grad_output", "cast_config_grad_output_for_grad_weight"))),
)


def float8_scaling(model: nn.Module) -> str | None:
    """How the converted float8 layers scale each GEMM operand, read from the layers.

    ``None`` when no layer was converted. A disabled cast leaves that operand in high
    precision (the rowwise-with-gw-hp recipe's weight-gradient GEMM).
    """
    from torchao.float8.float8_linear import Float8Linear

    layers = [m for m in model.modules() if isinstance(m, Float8Linear)]
    if not layers:
        return None
    cfg = layers[0].config
    gemms = []
    for gemm, operands in _FLOAT8_CASTS:
        parts = []
        for operand, attr in operands:
            cast = getattr(cfg, attr)
            if cast.scaling_type.value == "disabled":
                parts.append(f"{operand} high precision")
            else:
                dtype = str(cast.target_dtype).removeprefix("torch.")
                parts.append(f"{operand} {cast.scaling_granularity.value} {dtype}")
        gemms.append(f"{gemm} GEMM: {', '.join(parts)}")
    power2 = "; scales rounded to powers of 2" if cfg.round_scales_to_power_of_2 else ""
    return (f"float8 scaling of {len(layers)} Linear layers (torchao Float8LinearConfig): "
            f"{'; '.join(gemms)}{power2}")


def _add_lora(model: nn.Module, recipe: Recipe, lora_r: int, grad_checkpointing: bool):
    import bitsandbytes as bnb
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    quant_types = (bnb.nn.Linear8bitLt, bnb.nn.Linear4bit)
    targets = sorted(
        {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, quant_types)}
    )
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=grad_checkpointing)
    lora = LoraConfig(r=lora_r, lora_alpha=2 * lora_r, lora_dropout=0.0, target_modules=targets)
    model = get_peft_model(model, lora)
    trainable, total = model.get_nb_trainable_parameters()
    return model, {
        "r": lora.r, "alpha": lora.lora_alpha, "dropout": lora.lora_dropout,
        "target_modules": sorted(lora.target_modules), "bias": lora.bias,
        "peft_trainable_params": int(trainable), "peft_total_params": int(total),
    }


def load_model(
    model: str,
    precision: str | Recipe,
    device: torch.device | str,
    seed: int = 0,
    trust_remote_code: bool = False,
    lora_r: int = 8,
    grad_checkpointing: bool = False,
    train: bool = True,
    initial_weights: str | None = None,
    keep_bf16: frozenset[str] | None = None,
) -> LoadedModel:
    """Load ``model`` as the precision's recipe prescribes, on ``device``.

    With ``train`` the model is made ready to train (fp8 conversion, LoRA adapters,
    checkpointing); without it, it is just loaded, as the footprint command wants.
    ``initial_weights``: the run's fp32 initial weights (engine.models.initial_weights),
    loaded and cast in place of a random init when the source has no weights of its own.
    ``keep_bf16``: the Linear layers an fp8 recipe leaves in bf16, as an ":auto" recipe chose
    them (engine/run/fp8_auto.py); None: the recipe's own ":keep-..." rule.
    """
    recipe = precision if isinstance(precision, Recipe) else get_recipe(precision)
    device = torch.device(device)
    source = resolve_source(model)
    config, task = load_config(source, trust_remote_code)
    if hasattr(config, "use_cache"):  # training keeps no key/value cache, whatever the source
        config.use_cache = False
    if not source.has_weights and _holds_weights(initial_weights):
        # the run's seeded fp32 draw, cast to the recipe's dtype (quantised while loading)
        net = _from_pretrained(initial_weights, config, task, recipe, device, trust_remote_code,
                               True)
    elif recipe.quant and not source.has_weights:
        # bitsandbytes quantises while loading a checkpoint: write the random init as one.
        base = random_init(config, task, recipe.weight_dtype, torch.device("cpu"), seed,
                            trust_remote_code)
        with tempfile.TemporaryDirectory(prefix="ampscope-") as tmp:
            base.save_pretrained(tmp)
            del base
            net = _from_pretrained(tmp, config, task, recipe, device, trust_remote_code, True)
    elif source.has_weights:
        ref = source.ref
        net = _from_pretrained(ref, config, task, recipe, device, trust_remote_code,
                               source.kind == "hub")
    else:
        net = random_init(config, task, recipe.weight_dtype, device, seed, trust_remote_code)
    footprint = int(net.get_memory_footprint())
    note = footprint_note(config, net)
    if not train:
        return LoadedModel(net, config, task, source, footprint, note)
    if recipe.fp8:
        from torchao.float8 import convert_to_float8_training

        conv1d_to_linear(net)
        kept = kept_high(net, recipe.keep_high) if keep_bf16 is None else keep_bf16
        convert_to_float8_training(
            net, config=float8_config(recipe),
            module_filter_fn=lambda mod, fqn: fqn not in kept and _fp8_filter(mod, fqn))
        if device.type != "cuda":
            _cast_float8_inputs_under_cpu_autocast(net)
    if recipe.mx:
        convert_mx(net, recipe, device, seed)
    lora = None
    if recipe.lora:
        net, lora = _add_lora(net, recipe, lora_r, grad_checkpointing)
    elif grad_checkpointing:
        net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    net.train()
    return LoadedModel(net, config, task, source, footprint, note, lora)


def make_batches(
    config, task: str, batch_size: int, seq_len: int, count: int, seed: int,
    device: torch.device | str, windows: list[torch.Tensor] | None = None,
) -> list[dict]:
    """``count`` token batches in the task's layout, the same for every precision and device.

    ``windows``: the ``count`` (batch_size, seq_len) id tensors to lay out (text, from
    engine.models.training_data); None: uniform random ids. Drawn on the CPU with a seeded
    generator, then moved, so a trial on the GPU sees exactly the tokens a trial on the CPU
    sees.
    """
    gen = torch.Generator().manual_seed(seed)
    vocab = vocab_size(config)
    batches = []
    for i in range(count):
        ids = (torch.randint(0, vocab, (batch_size, seq_len), generator=gen) if windows is None
               else windows[i])
        if task == "masked-lm":
            masked = torch.rand((batch_size, seq_len), generator=gen) < 0.15
            masked[:, 0] = True  # at least one target per row, so the loss is defined
            labels = torch.where(masked, ids, torch.full_like(ids, -100))
            mask_id = getattr(config, "mask_token_id", None) or 0
            inputs = torch.where(masked, torch.full_like(ids, mask_id), ids)
            batch = {"input_ids": inputs, "labels": labels}
        elif task == "seq2seq-lm":
            # denoising-style identity task; the decoder reads the labels shifted right
            start = getattr(config, "decoder_start_token_id", None)
            start = start if start is not None else (getattr(config, "pad_token_id", None) or 0)
            decoder = torch.cat([torch.full((batch_size, 1), start), ids[:, :-1]], dim=1)
            batch = {"input_ids": ids, "decoder_input_ids": decoder, "labels": ids.clone()}
        else:
            batch = {"input_ids": ids, "labels": ids.clone()}
        batches.append({k: v.to(device) for k, v in batch.items()})
    return batches


def make_batch(loaded: LoadedModel, batch_size: int, seq_len: int, seed: int = 0,
               device: torch.device | str = "cpu") -> dict:
    """One synthetic batch for ``loaded`` (see ``make_batches``)."""
    return make_batches(loaded.config, loaded.task, batch_size, seq_len, 1, seed, device)[0]


def _holds_weights(folder: str | Path | None) -> bool:
    """Whether ``folder`` holds the run's initial weights (engine/models/initial_weights.py)."""
    return folder is not None and (Path(folder) / "model.safetensors").is_file()
