"""The plan's answer, one line per card: does it fit, and if not, the smallest change that
makes it fit, each change planned (traced, or predicted where the recipe cannot be traced)
rather than guessed.

The levers are tried in this order, from the smallest change to the largest, and the
search stops at the first rung where a recipe fits the card:

1. a smaller micro-batch (already searched by the plan's own verdicts);
2. gradient checkpointing, for each recipe asked;
3. an 8-bit AdamW (``adamw8bit``), then a 4-bit one (``adamw4bit``), each alone and then
   with gradient checkpointing;
4. a quantised recipe that was not asked (int8, then nf4: frozen quantised weights with
   LoRA adapters), alone and then with gradient checkpointing;
5. FSDP2 over 2, 4 and 8 cards (one rank's memory), for each recipe asked.

A rung is skipped without planning it when a lower bound drawn from the recipe's own plan
already exceeds the card's usable memory: the bytes held when the optimizer step begins
(parameters, buffers, quantisation state, gradients, optimizer state) do not shrink with
checkpointing, and parameters, buffers, quantisation state and gradients do not shrink
with another optimizer. Each skip is listed with its bound in ``tried``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from engine.core.config import TORCHAO_STEP, base_precision, split_label

GIB = 2**30
# what a rung changes in the asked configuration: (label, PlanConfig fields, precision or None)
QUANTISED = ("int8", "nf4")
# the recipes in the words people use: frozen quantised weights, trained LoRA adapters
QUANTISED_WORDS = {"int8": "LoRA on 8-bit weights (int8)",
                   "nf4": "QLoRA with 4-bit weights (nf4)"}
# torchao's 4-bit AdamW is a per-recipe optimiser ('RECIPE+adamw4bit'), not an --optimizer:
# its lever changes the recipe's label, and the distributed strategies refuse such labels
OPTIMIZER_LEVERS = (("adamw8bit", "8-bit AdamW (--optimizer adamw8bit)"),
                    ("adamw4bit", "4-bit AdamW (--precision {recipe}+adamw4bit)"))
FSDP2_WORLDS = (2, 4, 8)
DATASHEET_NOTE = ("the card's memory is its datasheet's nominal capacity, more than CUDA "
                  "reports (about 1%, 7% with ECC on)")
_STATIC = ("params", "buffers", "quant_state", "grads", "optimizer")


@dataclass(frozen=True)
class CardAnswer:
    card: str  # the table's name
    text: str  # the answer, one line
    fits_as_asked: tuple = ()  # the recipes that fit as asked
    precision: str | None = None  # the recipe the answer names
    change: str | None = None  # what to change; None: fits as asked, or nothing found
    headroom_bytes: int | None = None  # at the asked micro-batch (or the smaller one named)
    max_batch: int | None = None  # largest micro-batch that fits with the change
    method: str | None = None  # "traced" or "memory model"
    tried: tuple = ()  # every lever tried or skipped, with its figure or its bound


@dataclass(frozen=True)
class _Candidate:
    label: str  # how the answer names the change
    precision: str
    changes: dict = field(default_factory=dict)  # PlanConfig fields to replace


def _size(value: int) -> str:
    return f"{value / GIB:.2f} GiB" if abs(value) >= GIB else f"{value / 2**20:.0f} MiB"


def _static_bytes(memory, keep: tuple) -> int | None:
    """A lower bound on the peak that the lever leaves in place: the ``keep`` categories
    held when the optimizer step began, or at the peak, whichever is larger."""
    if memory is None:
        return None
    at_peak = {"params": memory.params_bytes, "buffers": memory.buffers_bytes or 0,
               "quant_state": memory.quant_state_bytes or 0, "grads": memory.grads_bytes,
               "optimizer": memory.optimizer_bytes}
    start = (memory.at_phase_start_bytes or {}).get("optimizer") or {}
    return max(sum(at_peak[k] for k in keep), sum(start.get(k, 0) for k in keep))


def _candidates(config, asked) -> list[tuple[str, list[_Candidate], tuple]]:
    """The rungs: (rung name, candidates, categories a candidate cannot shrink)."""
    ckpt = {} if config.grad_checkpointing else {"grad_checkpointing": True}
    ckpt_text = "" if config.grad_checkpointing else " and gradient checkpointing"
    plain = [t.precision for t in asked if not split_label(t.precision)[1]]
    rungs = []
    if ckpt:
        rungs.append(("gradient checkpointing",
                      [_Candidate("with gradient checkpointing", p, ckpt) for p in plain],
                      _STATIC))
    for optim, text in OPTIMIZER_LEVERS:
        per_recipe = optim in TORCHAO_STEP
        if config.optimizer == optim or (per_recipe and config.strategy != "none"):
            continue

        def cand(p, label, changes, optim=optim, per_recipe=per_recipe):
            if per_recipe:
                return _Candidate(label.format(recipe=p), f"{p}+{optim}", changes)
            return _Candidate(label, p, {"optimizer": optim, **changes})

        cands = [cand(p, f"with {text}", {}) for p in plain]
        if ckpt:
            cands += [cand(p, f"with {text}{ckpt_text}", ckpt) for p in plain]
        rungs.append((text.format(recipe="RECIPE"), cands,
                      ("params", "buffers", "quant_state", "grads")))
    asked_names = {base_precision(t.precision) for t in asked}
    quant = []
    for name in QUANTISED:
        if name in asked_names:
            continue
        quant.append(_Candidate(f"as {QUANTISED_WORDS[name]}", name, {}))
        if ckpt:
            quant.append(_Candidate(f"as {QUANTISED_WORDS[name]} and gradient checkpointing",
                                    name, ckpt))
    if quant:
        rungs.append(("a quantised recipe", quant, ()))
    if config.strategy == "none" and config.grad_accum == 1:
        for world in FSDP2_WORLDS:  # sharded: what it keeps is spread over the ranks
            rungs.append((f"FSDP2 over {world} cards",
                          [_Candidate(f"with FSDP2 over {world} cards (per rank)", p,
                                      {"strategy": "fsdp2", "nproc_per_node": world})
                           for p in plain if base_precision(p) not in QUANTISED], _STATIC))
    return rungs


def answer(config, result, plan_fn, log=lambda msg: None,
           planned_out: list | None = None) -> list[CardAnswer]:
    """One CardAnswer per card of ``result`` (a PlanResult of ``config``); ``plan_fn``
    plans a changed configuration (engine.run.plan.plan without levers); with
    ``config.levers`` off, only the recipes asked are judged. Each change planned is
    appended to ``planned_out`` as (recipe and change, card, PlanTrial)."""
    if not result.trials:
        return []
    planned: dict = {}  # (precision, changes) -> PlanTrial, shared by every card

    def plan_candidate(cand: _Candidate, cards: tuple):
        # per card: the trial's verdict is the card's it was planned on
        key = (cand.precision, tuple(sorted(cand.changes.items())), cards)
        if key not in planned:
            log(f"answer: planning {cand.precision} {cand.label}")
            try:
                changed = dataclasses.replace(
                    config, precisions=(cand.precision,), cards=cards, measured=(),
                    history=False, **cand.changes)
                planned[key] = plan_fn(changed, log).trials[0]
                if planned_out is not None:
                    planned_out.append((f"{cand.precision} {cand.label}",
                                        planned[key].cards[0].card, planned[key]))
            except (ValueError, RuntimeError) as exc:  # no such recipe under FSDP2, ...
                planned[key] = str(exc)
        return planned[key]

    names = [c.card for c in result.trials[0].cards]
    typed = list(config.cards)
    answers = []
    for index, card in enumerate(names):
        verdicts = [(t, t.cards[index]) for t in result.trials]
        found = _card_answer(config, result, card, typed[index], verdicts, plan_candidate)
        if verdicts[0][1].memory_kind == "datasheet":
            found = dataclasses.replace(found, text=f"{found.text}; {DATASHEET_NOTE}")
        answers.append(found)
    return answers


def _batch_text(best: int | None, asked: int) -> str:
    if best is None:
        return ""
    return f", up to micro-batch {best}" if best > asked else f", at micro-batch {best}"


def _spare(value: int) -> str:
    """Room left, to a tenth of a GiB (the answer's words; the table keeps two places)."""
    return f"{value / GIB:.1f} GiB" if abs(value) >= GIB else f"{value / 2**20:.0f} MiB"


def _recipe_words(precision: str) -> str:
    """A recipe as people name it: the quantised ones by what they train."""
    name = base_precision(precision)
    return QUANTISED_WORDS.get(name, precision) if name == precision else precision


def _change_words(cand: _Candidate) -> str:
    """The recipe and the change, plainly: 'QLoRA with 4-bit weights (nf4) and gradient
    checkpointing', 'fp32 with 8-bit AdamW (--optimizer adamw8bit)'."""
    if cand.label.startswith("as "):  # a quantised recipe: its words name it
        return cand.label[len("as "):]
    return f"{_asked(cand)} {cand.label}"


def _asked(cand: _Candidate) -> str:
    """The recipe asked that a candidate changes (a per-recipe optimiser's label has it
    before the '+')."""
    return cand.precision.partition("+")[0]


def _accum_text(config, largest: int) -> str:
    """How to keep the sequences per optimizer step at a smaller micro-batch: the largest
    divisor of them that fits, and the accumulation that makes them up."""
    total = config.batch_size * config.grad_accum
    micro = max(d for d in range(1, largest + 1) if total % d == 0)
    return (f" (micro-batch {micro} with --grad-accum {total // micro} keeps the {total} "
            "sequences per optimizer step)")


def _card_answer(config, result, card: str, typed: str, verdicts, plan_candidate) -> CardAnswer:
    head = f"{result.model} on {card}"
    known = [(t, v) for t, v in verdicts if v.fits is not None]
    if not known:
        reason = verdicts[0][1].reason or verdicts[0][0].reason or "n/a"
        return CardAnswer(card, f"{head}: n/a ({reason})")
    fitting = [(t, v) for t, v in known if v.fits]
    if fitting:
        (t, v), why = _roomiest(fitting, lambda tv: tv[0].precision,
                                lambda tv: tv[1].headroom_bytes, card)
        if len(fitting) == 1:
            said = f"{_recipe_words(t.precision)} fits as asked"
        else:
            names = ", ".join(tt.precision for tt, _ in fitting)
            said = (f"{names} fit as asked; {_recipe_words(t.precision)}"
                    f"{'' if why else ' leaves the most room'}")
        return CardAnswer(card, f"{head}: {said}"
                          f"{_batch_text(v.max_batch, config.batch_size)}, "
                          f"{_spare(v.headroom_bytes)} to spare ({t.method}){why}",
                          tuple(t.precision for t, _ in fitting), t.precision, None,
                          v.headroom_bytes, v.max_batch, t.method)
    usable = known[0][1].usable_bytes
    tried = []
    # rung 1: a smaller micro-batch, from the verdicts' own search
    smaller = [(t, v) for t, v in known if v.max_batch]
    if smaller:
        t, v = max(smaller, key=lambda tv: tv[1].max_batch)
        change = f"at micro-batch {v.max_batch}{_accum_text(config, v.max_batch)}"
        return CardAnswer(card, f"{head}: no recipe fits at micro-batch {config.batch_size}; "
                                f"{_recipe_words(t.precision)} fits {change} ({t.method})",
                          (), t.precision, change, None, v.max_batch,
                          t.method, ("a smaller micro-batch: fits",))
    if config.batch_size > 1:
        tried.append("a smaller micro-batch: "
                      + ("not even 1 fits" if any(v.max_batch == 0 for _, v in known)
                         else "not searched (--max-batch 0)"))
    if not config.levers:
        return CardAnswer(card, f"{head}: no recipe fits as asked (no other change was "
                                "planned: --no-levers)", tried=tuple(tried))
    asked = [t for t, _ in known]
    by_precision = {t.precision: t for t in asked}
    for _rung, cands, keep in _candidates(config, asked):
        found = []
        for cand in cands:
            base = by_precision.get(_asked(cand))
            bound = _static_bytes(base.memory, keep) if keep and base else None
            if bound is not None:  # FSDP2 shards it: each rank holds at least its share
                bound //= cand.changes.get("nproc_per_node", 1)
            if bound is not None and bound > usable:
                tried.append(f"{_asked(cand)} {cand.label}: skipped, what it keeps is "
                             f"{_size(bound)} already, over {_size(usable)} usable")
                continue
            trial = plan_candidate(cand, (typed,))
            if isinstance(trial, str):
                tried.append(f"{_asked(cand)} {cand.label}: not planned ({trial})")
                continue
            v = trial.cards[0]
            if v.fits is None:
                tried.append(f"{_asked(cand)} {cand.label}: n/a ({v.reason})")
            elif v.fits:
                found.append((cand, trial, v))
                tried.append(f"{_asked(cand)} {cand.label}: fits, "
                             f"{_size(v.headroom_bytes)} headroom ({trial.method})")
            else:
                tried.append(f"{_asked(cand)} {cand.label}: short by "
                             f"{_size(-v.headroom_bytes)} ({trial.method})")
        if found:
            (cand, trial, v), why = _roomiest(found, lambda f: f[0].precision,
                                              lambda f: f[2].headroom_bytes, card)
            method = trial.method if trial.method == "traced" else f"{trial.method}, not traced"
            return CardAnswer(
                card, f"{head}: no recipe fits as asked; {_change_words(cand)}"
                      f"{_batch_text(v.max_batch, config.batch_size)}, "
                      f"{_spare(v.headroom_bytes)} to spare ({method}){why}",
                (), cand.precision, cand.label, v.headroom_bytes, v.max_batch,
                trial.method, tuple(tried))
    least = min((t for t, _ in known), key=lambda t: t.memory.total_bytes)
    return CardAnswer(card, f"{head}: no recipe fits, as asked or with any lever AmpScope "
                            f"knows; the smallest peak asked is {least.precision}'s "
                            f"{_size(least.memory.total_bytes)} of {_size(usable)} usable",
                      tried=tuple(tried))


TIE_BYTES = 2**20  # recipes whose peaks differ by less than this tie on memory
TIE_WHY = ("; {precision} ties {other} on memory and is preferred: the card runs bf16 on its "
           "tensor cores, and bf16 autocast is the recipe people train in")


def _roomiest(items, precision_of, headroom_of, card: str):
    """The item with the most headroom, and '' ; where a bf16 autocast recipe ties an fp32
    one on memory and the card has a bf16 peak, the bf16 one, and why."""
    from engine.measure.peaks import peak_flops

    best = max(items, key=headroom_of)
    base = base_precision(precision_of(best))
    if base != "fp32" or peak_flops(card, "bf16").flops_per_s is None:
        return best, ""
    for item in items:
        tie = abs(headroom_of(item) - headroom_of(best)) <= TIE_BYTES
        if tie and base_precision(precision_of(item)) == "bf16-amp":
            return item, TIE_WHY.format(precision=precision_of(item), other=precision_of(best))
    return best, ""


def answer_lines(result) -> list[str]:
    """The answers, one line per card (the first lines of the CLI's plan)."""
    return [a.text for a in getattr(result, "answers", None) or []]
