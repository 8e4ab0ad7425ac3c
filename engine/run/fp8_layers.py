"""The Linear layers a float8 recipe converts, at the planned shape, and the payoff table
(engine.measure.fp8_payoff) for a plan: JSON, the CLI's lines and the filter to paste."""

from __future__ import annotations

import re

from engine.measure.fp8_payoff import Layer, break_even_tokens, card_recipes, payoff
from engine.measure.fp8_shape_cache import add_measured
from engine.measure.peaks import _entry as peak_entry

# the 16-bit recipes whose step the GEMMs are weighed against, best first
SIXTEEN_BIT = ("bf16-amp", "bf16", "fp16-amp", "fp16")


def linear_layers(model: str, tokens: int) -> list[Layer]:
    """Every Linear layer (GPT-2's Conv1D too: the fp8 recipes swap them for Linear)
    that AmpScope's float8 recipes convert, built on the meta device, with M = ``tokens``.
    The recipes keep the LM head (often tied to the embedding) and any layer with a
    dimension not divisible by 16 (engine.models.load._fp8_filter) in bf16."""
    import torch  # here, not above: a report of a run on a card without fp8 rates needs none
    from torch import nn

    from engine.models.hf import load_transformers
    from engine.models.load import load_config, model_class, resolve_source

    load_transformers()  # under its lock: the window's device probe may be importing it too
    from transformers.pytorch_utils import Conv1D

    config, task = load_config(resolve_source(model))
    with torch.device("meta"):
        net = model_class(task).from_config(config)
    layers = []
    for name, mod in net.named_modules():
        if isinstance(mod, nn.Linear):
            k, n = mod.in_features, mod.out_features
        elif isinstance(mod, Conv1D):
            k, n = mod.weight.shape  # Conv1D stores (in, out)
        else:
            continue
        if "lm_head" not in name and k % 16 == 0 and n % 16 == 0:
            layers.append(Layer(name, tokens, int(k), int(n)))
    return layers


def plan_payoff(result, cards: tuple[str, ...]) -> dict:
    """``payoff`` for a plan result (engine.run.plan.PlanResult) of ``cards`` (as given to
    the plan, in its order): per card (the table's name) and recipe, weighed against the
    planned 16-bit step on that card."""
    named = [c.card for c in result.trials[0].cards] if result.trials else []
    step_ms = {}
    for label in SIXTEEN_BIT:
        trial = next((t for t in result.trials if t.precision == label), None)
        for c in (trial.cards if trial else []):
            if c.predicted_step_ms is not None and c.card not in step_ms:
                step_ms[c.card] = (c.predicted_step_ms, f"the plan's {label} step "
                                   "(roofline, a lower bound)")
    tokens = result.batch_size * result.seq_len
    data = payoff(linear_layers(result.model, tokens), list(zip(named, cards)), step_ms)
    add_verdicts(data, dict(zip(named, cards)), result.model, result.batch_size,
                 result.seq_len)
    add_measured(data, dict(zip(named, cards)))
    return data


def add_verdicts(data: dict, lookup: dict, model: str, batch: int, seq: int) -> None:
    """Each entry's ``verdict``: one sentence on whether the recipe pays for this model and
    shape on the card, naming the largest GEMM and, where it does not pay, the micro-batch
    from which that GEMM would."""
    for card, recipes in data.items():
        for label, entry in recipes.items():
            if label != "reason":
                entry["verdict"] = _verdict(entry, label, card, lookup[card], model, batch,
                                            seq)


def _verdict(entry, label, card, name, model, batch, seq) -> str:
    rows = entry["layers"]
    if not rows:
        return f"{label}: {model} has no Linear layer the recipe converts"
    step = entry["step_speedup"]
    paying = [r for r in rows if r["pays"]]
    where = f"{model} at {batch} x {seq} on {card}"
    step_text = "" if step is None else f" (step x{step:.3f})"
    if paying and len(paying) == len(rows):
        return f"{label} would pay for {where}{step_text}: every converted layer pays"
    if paying and step is None:  # no 16-bit step: the layers' verdicts only
        return (f"{label} would pay for {len(paying)} of {len(rows)} layers of {where} (the "
                "filter below keeps the rest in bf16); the step's gain is n/a without a "
                "16-bit step to weigh them against")
    if paying:
        verb = "would" if step > 1.0 else "would not"
        return (f"{label} {verb} pay for {where} converting every layer{step_text}: "
                f"{len(paying)} of {len(rows)} layers pay (the filter below keeps the rest "
                f"in bf16); converting only those, step "
                f"x{entry['step_speedup_paying_only']:.3f}")
    big = max(rows, key=lambda r: r["k"] * r["n"])
    from_tokens = break_even_tokens(big["k"], big["n"], label, name, big["m"])
    after = ("" if from_tokens is None else
             f"; it would from {from_tokens} tokens per micro-batch "
             f"(batch {-(-from_tokens // seq)} x {seq})")
    return (f"{label} would not pay for {where}{step_text}: its largest GEMM ({big['m']} x "
            f"{big['k']} x {big['n']}) is below break-even (x{big['speedup']:.2f}){after}")


def layer_groups(rows: list[dict]) -> list[tuple[str, dict]]:
    """Layers with the same name but for their block numbers, and the same shape, as one line
    (``32 x model.layers.*.mlp.up_proj``): GPT-2's attention and MLP ``c_proj`` stay apart."""
    seen: dict = {}
    for r in rows:
        pattern = re.sub(r"(?<=\.)\d+(?=\.)", "*", r["name"])
        seen.setdefault((pattern, r["k"], r["n"]), (r, []))[1].append(r["name"])
    return [(names[0] if len(names) == 1 else f"{len(names)} x {key[0]}", r)
            for key, (r, names) in seen.items()]


def module_filter(keep: list[str], rows: list[dict]) -> str:
    """torchao's ``module_filter_fn`` keeping ``keep`` in bf16, by leaf name where every
    layer of that leaf name is kept, else by full name; the LM head too, as AmpScope's
    float8 recipes keep it (``linear_layers``)."""
    kept = set(keep)
    leaves = {r["name"].rsplit(".", 1)[-1] for r in rows}
    whole = sorted(leaf for leaf in leaves
                   if all(r["name"] in kept for r in rows if r["name"].endswith("." + leaf)
                          or r["name"] == leaf))
    rest = sorted(n for n in kept if n.rsplit(".", 1)[-1] not in whole)
    test = f"fqn.rsplit('.', 1)[-1] not in {(*whole, 'lm_head')!r}"
    if rest:
        test += f" and fqn not in {set(rest)!r}"
    return f"lambda mod, fqn: {test}"


def payoff_lines(data: dict) -> list[str]:
    """The CLI's short table: per card and recipe, the step's speed-up, the layers that pay
    and those that do not (and why), and the filter to paste."""
    lines = ["fp8 payoff (predicted: each Linear layer's three training GEMMs with their "
             "casts, against bf16; 'measured' where peak --fp8-shapes timed that shape on "
             "that card):"]
    for card, recipes in data.items():
        if "reason" in recipes:
            lines.append(f"  {card}: n/a: {recipes['reason']}")
            continue
        for label, entry in recipes.items():
            step = entry["step_speedup"]
            step_text = (f"step x{step:.3f}" if step is not None
                         else entry["step_basis"])
            calibration = entry["calibration"].split(":")[0]  # "fitted" or "uncalibrated"
            lines.append(f"  {card}, {label} ({calibration}): {step_text}")
            if entry.get("verdict"):
                lines.append(f"    {entry['verdict']}")
            for name, r in layer_groups(entry["layers"]):
                verdict = "pays" if r["pays"] else "does not pay"
                lines.append(f"    {verdict:12} x{r['speedup']:.2f}  {name} "
                             f"({r['m']} x {r['k']} x {r['n']}): {r['why']}; "
                             f"{measured_text(r)}")
            if entry["keep_bf16"] and len(entry["keep_bf16"]) < len(entry["layers"]):
                lines.append(f"    filter to paste: module_filter_fn="
                             f"{module_filter(entry['keep_bf16'], entry['layers'])}")
            elif entry["keep_bf16"]:
                lines.append("    no layer pays: keep this model in bf16")
    return lines


def measured_text(row: dict) -> str:
    """A layer row's measured figure, or that it is predicted only."""
    if row.get("measured_speedup") is None:
        return "predicted (no timing of this shape on this card is cached)"
    return f"measured x{row['measured_speedup']:.2f} on {row['measured_on']}"


def report_payoff(record) -> dict:
    """``payoff`` for a profile's run record (engine.record.run_record.RunRecord): on the
    card it ran on, weighed against its measured 16-bit step where it ran one."""
    config = record.config or {}
    device = (record.environment or {}).get("device")
    card = device.get("name") if isinstance(device, dict) else device  # older: the name
    if not isinstance(card, str) or not card or not isinstance(config.get("model"), str):
        return {}
    step = None
    for label in SIXTEEN_BIT:
        trial = next((t for t in record.trials if t.precision == label and t.summary
                      and t.summary.median_step_ms), None)
        if trial is not None:
            how = "compiled" if config.get("compile") else "eager"
            step = (trial.summary.median_step_ms,
                    f"this run's {label} step (measured median, {how})")
            break
    reason, lookup = card_recipes(card)[1], card
    named = config.get("payoff_card")  # the card an ':auto' recipe weighed (--card)
    if reason and isinstance(named, str) and not card_recipes(named)[1]:
        # that card's table, as the trial used it; this run's step is not that card's
        card, lookup, step, reason = peak_entry(named)["name"], named, None, None
    if reason:  # a CPU, or a card with no low-precision rate: no model to build
        return {card: {"reason": reason}}
    tokens = (config.get("batch_size") or 1) * (config.get("seq_len") or 1)
    try:
        layers = linear_layers(config["model"], tokens)
    except Exception as exc:  # noqa: BLE001 (a derived key never stops a report's export:
        # a user's own model, a folder since deleted, a hub id not cached here)
        return {card: {"reason": f"the model's Linear layers are not known here: {exc}"}}
    data = payoff(layers, [(card, lookup)], {card: step} if step else None)
    add_verdicts(data, {card: lookup}, config["model"], config.get("batch_size") or 1,
                 config.get("seq_len") or 1)
    add_measured(data, {card: lookup})
    return data
