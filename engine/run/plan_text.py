"""The plan as text: the CLI's lines, and the sizes, durations and traced-vs-measured rows
the window shows too (engine.run.plan makes the PlanResult)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.measure.peaks import _entry as peak_entry

if TYPE_CHECKING:
    from engine.run.plan import CardVerdict, PlanResult, PlanTrial

_DDP_NOTE = ("; DDP's gradient buckets computed, not traced: DDP cannot run on a fake "
             "process group")



def _gib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 2**30:.2f} GiB"


# the rows of traced vs measured: the peak, then its categories
SIDE_BY_SIDE = (("peak", "total_bytes"), ("params", "params_bytes"),
                ("buffers", "buffers_bytes"), ("quant state", "quant_state_bytes"),
                ("grads", "grads_bytes"),
                ("optimizer", "optimizer_bytes"), ("inputs", "inputs_bytes"),
                ("weight copies", "weight_copies_bytes"), ("activations", "activations_bytes"),
                ("temporaries", "temporaries_bytes"))


def size_text(value: int | None) -> str:
    """Bytes in GiB from 1 GiB up, else MiB: a tiny model's figures stay readable."""
    if value is None:
        return "n/a"
    return _gib(value) if abs(value) >= 2**30 else f"{value / 2**20:.2f} MiB"


def duration_text(ms: float | None) -> str:
    """A step time a person reads at a glance: '0.42 ms', '107 ms', '1.83 s', '2 min 5 s'."""
    if ms is None:
        return "n/a"
    if ms < 1000:
        return f"{ms:.2g} ms" if ms < 10 else f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.3g} s"
    minutes, seconds = divmod(round(ms / 1000), 60)
    return f"{minutes} min {seconds} s"


def peak_phase_note(memory) -> str:
    """Where the peak falls, which explains its categories: in the optimizer step, or late
    in backward, the activations are already freed (0 B there is right, not missing)."""
    if memory is None or not memory.peak_phase:
        return ""
    note = f"; the peak falls in {memory.peak_phase}"
    if memory.peak_phase != "forward" and not memory.activations_bytes:
        note += (", after backward freed the activations" if memory.peak_phase == "optimizer"
                 else ", once the activations it used were freed")
    return note


def difference_text(traced: int | None, measured: int | None) -> str:
    """Traced minus measured, as a share of the measured figure."""
    if traced is None or measured is None:  # a distributed trial keeps fewer categories
        return "n/a"
    if measured == 0:
        return "equal" if traced == 0 else f"+{size_text(traced)}"
    return f"{(traced - measured) / measured:+.1%}"


def side_by_side(trial: PlanTrial) -> list[tuple[str, str, str, str]]:
    """(row, traced, measured, difference) for a trial with a measured twin."""
    rows = []
    for label, name in SIDE_BY_SIDE:
        traced = getattr(trial.memory, name) if trial.memory else None
        measured = getattr(trial.measured.memory, name)
        rows.append((label, size_text(traced), size_text(measured),
                     difference_text(traced, measured)))
    return rows


def measured_over_predicted(trial: PlanTrial, card: CardVerdict) -> float | None:
    """The measured twin's median step over this card's roofline, where the twin ran on
    this card (a lower bound holds when it is 1 or more); None otherwise."""
    m = trial.measured
    if m is None or m.step_ms is None or card.predicted_step_ms is None:
        return None
    ran_on = peak_entry(m.device)
    if ran_on is None or ran_on["name"] != peak_entry(card.card)["name"]:
        return None
    return m.step_ms / card.predicted_step_ms


def _measured_lines(trial: PlanTrial) -> list[str]:
    m = trial.measured
    if m is None:
        return ["  measured: no real trial of this model, shape and recipe in the run history "
                "(profile it to compare)"]
    lines = [f"  traced vs measured: run {m.run_id} on {m.device}", f"    from {m.source}",
             f"    {'':<14}{'traced':>12}{'measured':>12}{'traced vs measured':>20}"]
    lines += [f"    {row:<14}{t:>12}{r:>12}{d:>20}" for row, t, r, d in side_by_side(trial)]
    if m.step_ms is not None:
        lines.append(f"    step: measured {duration_text(m.step_ms)} (median) on {m.device}")
    return lines


def format_plan(result: PlanResult) -> str:
    accum = (f" x {result.grad_accum} micro-batches (gradients accumulated)"
             if result.grad_accum > 1 else "")
    world = (f", {result.strategy.upper()} rank 0 of {result.nproc_per_node} (per-rank figures"
             f"{_DDP_NOTE if result.strategy == 'ddp' else ''})"
             if result.strategy != "none" else "")
    from engine.run.plan_answer import answer_lines

    lines = answer_lines(result)
    lines += [f"plan: {result.model}, batch {result.batch_size} x {result.seq_len} tokens"
             f"{accum}{world}, {result.optimizer}"
             f"{', gradient checkpointing' if result.grad_checkpointing else ''}"
             f"; CUDA context allowance {_gib(result.context_bytes)}"]
    for trial in result.trials:
        mem = trial.memory
        head = f"{trial.precision}: peak {size_text(mem.total_bytes if mem else None)} " \
               f"({trial.method})"
        if mem is not None:
            head += (f"; params {size_text(mem.params_bytes)}, grads "
                     f"{size_text(mem.grads_bytes)}, optimizer {size_text(mem.optimizer_bytes)}, "
                     f"weight copies {size_text(mem.weight_copies_bytes)}, activations "
                     f"{size_text(mem.activations_bytes)}, temporaries "
                     f"{size_text(mem.temporaries_bytes)}")
            if mem.quant_state_bytes:  # bitsandbytes' scales and code books
                head += f", quant state {size_text(mem.quant_state_bytes)}"
            head += peak_phase_note(mem)
        lines.append(head)
        if trial.autocast_policy:
            lines.append(f"  autocast traced: {trial.autocast_policy}")
        if trial.scaling:
            lines.append(f"  {trial.scaling}")
        if trial.reason:
            lines.append(f"  note: {trial.reason}")
        lines += _measured_lines(trial)
        for c in trial.cards:
            if c.fits is None:
                lines.append(f"  {c.card}: n/a ({c.reason})")
                continue
            verdict = "fits" if c.fits else "does not fit"
            room = "headroom" if c.fits else "short by"
            batch = "n/a" if c.max_batch is None else str(c.max_batch)
            step = (f"{duration_text(c.predicted_step_ms)} ({c.bound}-bound roofline)"
                    if c.predicted_step_ms is not None else c.prediction_model)
            nominal = (" (the datasheet's nominal capacity: CUDA reports less)"
                       if c.memory_kind == "datasheet" else "")
            ratio = measured_over_predicted(trial, c)
            ratio = "" if ratio is None else f"; measured / predicted {ratio:.2f}"
            lines.append(f"  {c.card}: {verdict} in {_gib(c.usable_bytes)} usable{nominal}, "
                         f"{room} {_gib(abs(c.headroom_bytes))}; largest micro-batch {batch}; "
                         f"predicted step {step}{ratio}")
    return "\n".join(lines)
