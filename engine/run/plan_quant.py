"""int8 and nf4 on fake tensors, as bitsandbytes runs them on the card.

A trial loads a quantised recipe with transformers' bitsandbytes quantizer: it swaps the
Linear layers for ``Linear8bitLt`` / ``Linear4bit`` and quantises each weight as it is
loaded (engine.models.load ``_bnb_config``), then adds the trial's LoRA adapters. Fake
tensors have no checkpoint to load, and bitsandbytes' ``Int8Params`` / ``Params4bit``
cannot wrap a fake tensor, so ``load_quantised`` does the same steps on the fake model:
the quantizer's own layer swap, then each weight quantised by bitsandbytes' own functions
(their registered fake kernels), which give exactly the tensors the card stores: int8
``CB`` plus fp32 row scales ``SCB``; nf4's packed uint8 data plus its quant state (absmax,
the code book, and the nested state where the config asks for double quantisation). The
weight is a fake parameter that carries bitsandbytes' attributes (``CB``/``SCB``,
``quant_state``...), which is all ``Linear8bitLt`` / ``Linear4bit`` and peft read.

The step then runs bitsandbytes' own layers. Where the CUDA path differs from the CPU's:

- int8: ``bitsandbytes.matmul`` trains with ``MatMul8bitFp`` on a CPU tensor (it
  dequantises each weight and multiplies in the input's dtype); on CUDA it runs
  ``MatMul8bitLt``: the input cast to fp16 and quantised to int8 (``int8_vectorwise_quant``)
  and an int8 matmul (``int8_mixed_scaled_mm``) in forward, which keeps the input for
  backward; backward dequantises the weight (``CB`` x ``SCB`` / 127) in the input's dtype.
  ``bitsandbytes_as(card=True)`` makes the trace take that branch.
- the outlier columns (inputs whose magnitude reaches the threshold, 6.0) depend on the
  values, which fake tensors have none of: the trace takes the branch with none
  (``NoOutliers``), so ``subA`` (the outlier columns kept for backward, rows x outliers in
  the input's dtype) is empty.
- peft's LoRA layers ask ``torch.is_autocast_enabled()``, CUDA's autocast, which is on in
  the recipe's region on the card and off on the CPU trace; it answers as on the card.
- nf4 runs the same code on both (``gemm_4bit`` forward, ``dequantize_4bit`` in backward).

Trials load with ``bnb_4bit_use_double_quant=False``. With double quantisation,
bitsandbytes 0.50's ``quantize_4bit`` reads a value of the absmax it quantises (an
``aten._local_scalar_dense``), which fake tensors cannot give: such a recipe would fall
back to the memory model, saying so.

Kernels' inner scratch (the CUDA kernels' outlier masks, a fallback's dequantised weight
inside ``gemm_4bit``) is not seen on the card either: engine.measure.memtrack sees an op's
results, not what it allocates and frees within itself.
"""

from __future__ import annotations

import functools
import logging
import threading
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode

CUDA_NOTE = ("bitsandbytes as on CUDA: int8 through MatMul8bitLt (int8 activations, int8 "
             "matmul, the weight dequantised in backward), nf4 through MatMul4Bit; no "
             "outlier columns (data-dependent: a fake tensor has no values), so LLM.int8's "
             "kept outlier inputs (rows x outliers) are not in the figure")
CPU_NOTE = ("bitsandbytes as on the CPU: int8 through MatMul8bitFp (each weight dequantised "
            "to the input's dtype), nf4 through MatMul4Bit")


def quant_note(precision: str, trace_as: str) -> str:
    """How the trace ran bitsandbytes' layers, for the traced memory's notes ("" where the
    recipe has none)."""
    from engine.core.config import base_precision
    from engine.core.recipes import recipe

    if not recipe(base_precision(precision)).quant:
        return ""
    return f"{CUDA_NOTE if trace_as == 'card' else CPU_NOTE}; "


def load_quantised(model: str, rec, device: torch.device, seed: int, trust: bool,
                   lora_r: int, grad_checkpointing: bool):
    """engine.models.load.load_model for a quantised recipe, under an active FakeTensorMode:
    the model ``from_pretrained`` would build, with fake quantised weights."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from transformers.quantizers import AutoHfQuantizer

    from engine.models.load import (
        LoadedModel,
        _add_lora,
        _bnb_config,
        footprint_note,
        load_config,
        random_init,
        resolve_source,
    )

    source = resolve_source(model)
    config, task = load_config(source, trust)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    net = random_init(config, task, rec.weight_dtype, device, seed, trust)
    originals = {name: (m.weight, getattr(m, "bias", None)) for name, m in net.named_modules()
                 if isinstance(getattr(m, "weight", None), torch.Tensor)}
    quantizer = AutoHfQuantizer.from_config(_bnb_config(rec), pre_quantized=False)
    with unset_fake_temporarily():  # its new layers are made on meta, outside the fake mode
        quantizer.preprocess_model(net, dtype=rec.weight_dtype, device_map={"": device.type})
    with torch.no_grad():  # loading quantises values, not a graph
        _quantise_layers(net, originals)
    quantizer.postprocess_model(net)
    footprint = int(net.get_memory_footprint())
    note = footprint_note(config, net)
    with _moves_in_place():
        net, lora = _add_lora(net, rec, lora_r, grad_checkpointing)
    net.train()
    return LoadedModel(net, config, task, source, footprint, note, lora)


def _quantise_layers(net, originals: dict) -> None:
    """Each bitsandbytes layer's weight quantised as transformers' loading does
    (Bnb8bitQuantize / Bnb4bitQuantize), by bitsandbytes' functions on fake tensors."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as F
    from transformers.pytorch_utils import Conv1D

    for name, module in net.named_modules():
        if not isinstance(module, (bnb.nn.Linear8bitLt, bnb.nn.Linear4bit)):
            continue
        weight, bias = originals[name]
        # Conv1D (GPT-2) stores its weight transposed: loading transposes it first
        value = weight.T if issubclass(module.source_cls, Conv1D) else weight
        value = value.contiguous()
        empty = module.weight  # the quantizer's meta parameter, with bitsandbytes' settings
        if isinstance(module, bnb.nn.Linear8bitLt):
            # Int8Params._quantize: fp16, then int8 rows and their fp32 absmax scales
            cb, scb, _ = F.int8_vectorwise_quant(value.to(torch.float16))
            new = torch.nn.Parameter(cb, requires_grad=False)
            new.CB, new.SCB, new.has_fp16_weights = cb, scb, empty.has_fp16_weights
        else:
            # Params4bit._quantize
            packed, state = F.quantize_4bit(
                value, blocksize=empty.blocksize, compress_statistics=empty.compress_statistics,
                quant_type=empty.quant_type, quant_storage=empty.quant_storage)
            new = torch.nn.Parameter(packed, requires_grad=False)
            for attr in ("blocksize", "compress_statistics", "quant_type", "quant_storage"):
                setattr(new, attr, getattr(empty, attr))
            new.quant_state, new.bnb_quantized, new.module = state, True, module
            module.quant_state = state
        module.weight = new
        if bias is not None:
            module.bias = bias


def in_this_thread(replacement, real):
    """``replacement`` for the thread that traces, ``real`` for every other: the window's
    Plan tab traces in a thread beside the GUI's own, and a swapped library function is
    seen by every thread of the process."""
    owner = threading.get_ident()

    @functools.wraps(real)
    def call(*args, **kwargs):
        return (replacement if threading.get_ident() == owner else real)(*args, **kwargs)
    return call


@contextmanager
def _moves_in_place():
    """peft moves each new adapter to its base layer's device (and a 4-bit layer's compute
    dtype) with ``Module.to``, which swaps parameters, and torch cannot swap a fake one.
    Everything here is on the one device, so a move is its dtype cast, made in place."""
    real = torch.nn.Module.to

    def to(self, *args, **kwargs):
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        for t in [*self.parameters(), *self.buffers()]:
            if device is not None and t.device != device:
                raise ValueError(f"a fake {t.device} tensor cannot move to {device}")
            if dtype is not None and (t.is_floating_point() or t.is_complex()):
                t.data = t.data.to(dtype)
        return self

    torch.nn.Module.to = in_this_thread(to, real)
    try:
        yield
    finally:
        torch.nn.Module.to = real


def _cuda_matmul(A, B, out=None, state=None, threshold=0.0, bias=None):
    """``bitsandbytes.matmul`` as it runs on a CUDA tensor: MatMul8bitLt (bitsandbytes 0.50
    sends training on the CPU to MatMul8bitFp by the input's device)."""
    from bitsandbytes.autograd._functions import MatMul8bitLt, MatmulLtState

    state = state or MatmulLtState()
    if threshold > 0.0:
        state.threshold = threshold
    return MatMul8bitLt.apply(A, B, out, bias, state)


class NoOutliers(TorchDispatchMode):
    """LLM.int8's data-dependent outputs with no outlier column: ``int8_vectorwise_quant``
    returns an empty index and ``int8_mixed_scaled_mm`` an empty ``subA``, what the CUDA
    kernels return when no input reaches the threshold (their registered fake kernels ask
    for a dynamic size, which a trace without symbolic shapes cannot give)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.name()
        if name == "bitsandbytes::int8_vectorwise_quant":
            a = args[0]
            threshold = args[1] if len(args) > 1 else kwargs.get("threshold", 0.0)
            if threshold > 0.0:
                rows = a.numel() // a.shape[-1]
                return (torch.empty(a.shape, dtype=torch.int8, device=a.device),
                        torch.empty(rows, dtype=torch.float32, device=a.device),
                        torch.empty(0, dtype=torch.int64, device=a.device))
        if name == "bitsandbytes::int8_mixed_scaled_mm":
            a, ca, cb = args[:3]
            return (torch.empty((*ca.shape[:-1], cb.shape[0]), dtype=a.dtype, device=a.device),
                    torch.empty(0, dtype=a.dtype, device=a.device))
        return func(*args, **kwargs)


@contextmanager
def bitsandbytes_as(card: bool):
    """The quantised layers' step as the card runs it (``card``), or as the CPU does."""
    import bitsandbytes as bnb

    real, enabled = bnb.matmul, torch.is_autocast_enabled
    quiet = logging.getLogger("bitsandbytes.autograd._functions")
    level = quiet.level
    if card:
        bnb.matmul = in_this_thread(_cuda_matmul, real)
        torch.is_autocast_enabled = in_this_thread(_cuda_region_enabled, enabled)
        # MatMul8bitLt warns on every fp32 input it casts to fp16 (every layer, every step)
        quiet.setLevel(logging.ERROR)
    try:
        with NoOutliers():
            yield
    finally:
        bnb.matmul, torch.is_autocast_enabled = real, enabled
        quiet.setLevel(level)


_is_autocast_enabled = torch.is_autocast_enabled


def _cuda_region_enabled(device_type: str | None = None) -> bool:
    """``torch.is_autocast_enabled()`` as the card answers it. Without an argument it asks
    about CUDA's autocast, which is on in the recipe's region on the card; the trace runs
    that region as CPU autocast (engine.run.plan_autocast), so the CPU's state answers.
    peft's LoRA layers over bitsandbytes ask it: with autocast off they cast the input to
    the adapter's dtype (fp32) and keep the adapter's fp16 recast of it for backward."""
    return _is_autocast_enabled("cpu" if device_type is None else device_type)
