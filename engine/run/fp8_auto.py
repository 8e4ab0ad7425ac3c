"""The ":auto" float8 recipes (``fp8:auto``, ``fp8-rowwise:auto``): convert only the Linear
layers the payoff model (engine.measure.fp8_payoff) predicts to pay, at the trial's tokens per
micro-batch, on one card.

Which card: ``--card`` where given (the card a user plans to train on; on a GPU it overrides
the card the trial runs on, and the note says both), else the GPU the trial runs on. A CPU is
no card: an ":auto" trial there without ``--card`` is refused before it loads anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.config import AUTO, RunConfig, split_keep, split_label
from engine.measure.fp8_payoff import card_recipes, payoff
from engine.measure.peaks import _entry as peak_entry
from engine.measure.peaks import table

CARD_HINT = 'name the card whose payoff to use with --card (e.g. --card "H100 SXM")'


def is_auto(label: str) -> bool:
    return split_keep(split_label(label)[0])[1] == AUTO


def _recipe(label: str) -> str:
    return split_keep(split_label(label)[0])[0]


def card_reason(label: str, card: str | None, device_kind: str,
                device_name: str | None = None) -> str | None:
    """Why ``label`` (an ":auto" recipe) cannot pick its layers on ``card`` (None: the GPU
    the trial runs on, named ``device_name`` where known), or None."""
    named = card is not None
    if not named:
        if device_kind != "cuda":
            return (f"{label} converts the layers predicted to pay on a GPU, and this trial "
                    f"runs on the CPU: {CARD_HINT}")
        if device_name is None:  # the trial checks the GPU's own name
            return None
        card = device_name
    which = "(--card)" if named else "(the GPU this trial runs on)"
    if peak_entry(card) is None:
        known = ", ".join(g["name"] for g in table()["gpus"])
        return f"unknown card '{card[:80]}' {which}: {CARD_HINT}; choose from {known}"
    recipes, reason = card_recipes(card)
    if reason or _recipe(label) not in [r.label for r in recipes]:
        return (f"{label}: {peak_entry(card)['name']} {which} has no payoff table for "
                f"{_recipe(label)} ({reason or 'no fp8 rate in resources/peak_flops.json'}): "
                f"{CARD_HINT}")
    return None


def check_auto(config: RunConfig) -> None:
    """The CLI's check before any trial: a ValueError saying what to do."""
    auto = [label for label in config.precisions if is_auto(label)]
    if not auto:
        if config.payoff_card is not None:
            raise ValueError("--card names the card whose payoff an ':auto' recipe converts "
                             "by: add one (e.g. --precision fp8-rowwise:auto) or leave out "
                             "--card")
        return
    kind = "cuda" if config.device.startswith("cuda") else "cpu"
    if config.device == "auto":
        import torch

        kind = "cuda" if torch.cuda.is_available() else "cpu"
    for label in auto:
        reason = card_reason(label, config.payoff_card, kind)
        if reason:
            raise ValueError(reason)


@dataclass(frozen=True)
class AutoChoice:
    card: str  # the peaks table's name of the card whose payoff was used
    card_source: str  # how that card was chosen
    tokens: int  # M: tokens per micro-batch
    keep_bf16: frozenset[str]  # the layers predicted not to pay
    layers: tuple[dict, ...]  # the payoff rows (name, m, k, n, speedup, pays, why)


def choose(config: RunConfig, label: str, device_name: str, device_kind: str) -> AutoChoice:
    """The payoff table of ``label``'s recipe for the trial's shape on its card."""
    reason = card_reason(label, config.payoff_card, device_kind, device_name)
    if reason:
        raise ValueError(reason)
    card = config.payoff_card or device_name
    name = peak_entry(card)["name"]
    if config.payoff_card is None:
        source = "the GPU this trial ran on"
    elif device_kind == "cuda" and peak_entry(device_name) is not None and (
            peak_entry(device_name)["name"] == name):
        source = "--card, the GPU this trial ran on"
    else:
        source = f"--card; this trial ran on {'the CPU' if device_kind != 'cuda' else device_name}"
    from engine.run.fp8_layers import linear_layers  # torch: only once a trial runs

    tokens = config.batch_size * config.seq_len
    entry = payoff(linear_layers(config.model, tokens), [(name, card)])[name][_recipe(label)]
    return AutoChoice(name, source, tokens, frozenset(entry["keep_bf16"]),
                      tuple(entry["layers"]))


def converted_names(model) -> list[str]:
    """The Linear layers that run float8 in ``model``, as converted (what ran)."""
    from torchao.float8.float8_linear import Float8Linear

    return [name for name, mod in model.named_modules() if isinstance(mod, Float8Linear)]


def summary(choice: AutoChoice, model) -> dict:
    """The trial's ``fp8_auto``: the card, the layers that ran float8 (read from the model)
    and those kept in bf16, with each one's predicted speed-up."""
    converted = converted_names(model)
    speedup = {r["name"]: r["speedup"] for r in choice.layers}
    return {"card": choice.card, "card_source": choice.card_source, "tokens": choice.tokens,
            "converted": converted,
            "kept_bf16": [r["name"] for r in choice.layers if r["name"] not in converted],
            "speedup": speedup,
            "basis": "predicted by the payoff model (engine/measure/fp8_payoff.py), not "
                     "measured: each layer's three training GEMMs with casts against bf16"}


def note(label: str, auto: dict) -> str:
    """The trial's note naming the layers it converted."""
    done, kept = auto["converted"], auto["kept_bf16"]
    head = (f"{label}: the payoff of {auto['card']} ({auto['card_source']}) at "
            f"{auto['tokens']} tokens per micro-batch (predicted, not measured): ")
    if not done:
        return head + (f"no layer pays, all {len(kept)} stayed in bf16 (its matmuls ran as "
                       "bf16-amp's)")
    text = head + f"converted {len(done)} of {len(done) + len(kept)} layers: " + ", ".join(
        f"{n} (x{auto['speedup'].get(n, float('nan')):.2f})" for n in done)
    return text + (f"; kept in bf16: {', '.join(kept)}" if kept else "")


def auto_notes(trials) -> list[str]:
    """The note of each ':auto' trial that picked its layers (for the CLI, after the table)."""
    return [note(t.precision, t.fp8_auto) for t in trials if getattr(t, "fp8_auto", None)]
