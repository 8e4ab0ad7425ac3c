"""What a Trainer's ``TrainingArguments`` ask for, beside what ran (DESIGN.md 26).

The precision label comes from the steps themselves (ampscope/what_ran.py); the arguments
give the settings a step cannot show (gradient checkpointing, the optimizer's name,
quantisation, adapters, accumulation) and, where they asked for a precision that did not
run (``fp16=True`` on a CPU, where accelerate turns native AMP off and keeps no
GradScaler), a note in the run says so.
"""

from __future__ import annotations

# what each argument asks for: (AmpScope precision, its words)
_ASKED = {"fp16": ("fp16-amp", "fp16 autocast + GradScaler"),
          "bf16": ("bf16-amp", "bf16 autocast")}


def quantisation(model) -> str | None:
    """'nf4' or 'int8' when the model was loaded quantised by bitsandbytes."""
    config = getattr(getattr(model, "config", None), "quantization_config", None)
    if config is None:
        return None
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    if get("load_in_4bit"):
        return "nf4"
    if get("load_in_8bit"):
        return "int8"
    return str(get("quant_method", "quantised"))


def _lora(model) -> str | None:
    peft = getattr(model, "peft_config", None)
    if not peft:
        return None
    parts = []
    for name, cfg in peft.items():
        targets = getattr(cfg, "target_modules", None)
        shown = ",".join(sorted(targets)) if isinstance(targets, (set, list, tuple)) else targets
        # peft's PeftType is a str enum (its f-string is "PeftType.LORA" on Python 3.11);
        # DoRA is a LoRA config with use_dora set
        kind = getattr(getattr(cfg, "peft_type", None), "value", None) or "adapter"
        kind = "DoRA" if getattr(cfg, "use_dora", False) else kind.replace("LORA", "LoRA")
        parts.append(f"{name}: {kind} r={getattr(cfg, 'r', '?')} on {shown}")
    return "; ".join(parts)


def settings(args, model) -> str:
    """The Trainer's settings a step does not show, as the recipe's second half."""
    quant = quantisation(model)
    lora = _lora(model)
    optim = getattr(args.optim, "value", args.optim)
    parts = [f"gradient checkpointing {'on' if args.gradient_checkpointing else 'off'}",
             f"optim={optim}",
             f"quantisation {quant}" if quant else "no quantisation",
             f"LoRA {lora}" if lora else "no adapters"]
    if args.gradient_accumulation_steps > 1:
        parts.append(f"gradient accumulation {args.gradient_accumulation_steps}")
    return ", ".join(parts)


def notes(args, ran: str, recipe: str, device_type: str) -> list[str]:
    """A note for each precision the arguments asked for that is not what ran."""
    out = []
    why = " (it keeps fp16 AMP off on a CPU)" if device_type == "cpu" else ""
    for flag, (precision, words) in _ASKED.items():
        if getattr(args, flag, False) and ran != precision:
            out.append(f"TrainingArguments({flag}=True) asked for {precision} ({words}), but "
                       f"{ran} ran ({recipe.split(', optimizer')[0]}): accelerate did not "
                       f"enable it here{why}; the figures are those of {ran}")
    return out
