"""Real trials beside a plan's traced ones: the same model, shape and recipe, measured.

A plan looks through the runs this machine journaled (``runs/*.jsonl`` in the data
folder, what History lists: every CLI and window run writes one) and any reports named
with ``--measured``, for a finished trial of the same model (name, and the same number
of parameters: a folder whose config changed is another model), micro-batch, sequence
length, gradient checkpointing and accumulation, strategy and world size, and the same
recipe and optimizer. A named report wins over the history; among runs, the newest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from engine.core.config import split_label
from engine.core.events import MemoryBreakdown


@dataclass(frozen=True)
class MeasuredTrial:
    source: str  # the journal or report file the trial was read from
    run_id: str
    device: str  # what the trial ran on, as the trial names it
    memory: MemoryBreakdown  # the trial's own breakdown (a distributed run: its largest rank)
    step_ms: float | None = None  # its median step time (the roofline's lower bound beside it)


def _model_key(text: str) -> str:
    """A model as ``--model`` resolves it (a folder by its absolute path); text that does
    not resolve here (a folder of another machine) stands for itself."""
    from engine.models.load import resolve_source

    try:
        return resolve_source(str(text)).ref
    except ValueError:
        return str(text).strip()


def _shape(config: dict) -> tuple:
    strategy = config.get("strategy", "none")
    return (config.get("batch_size"), config.get("seq_len"),
            bool(config.get("grad_checkpointing", False)), config.get("grad_accum", 1),
            strategy, 1 if strategy == "none" else config.get("nproc_per_node", 1))


def plan_shape(config) -> tuple:
    """The same key for a PlanConfig."""
    return _shape({"batch_size": config.batch_size, "seq_len": config.seq_len,
                   "grad_checkpointing": config.grad_checkpointing,
                   "grad_accum": config.grad_accum, "strategy": config.strategy,
                   "nproc_per_node": config.nproc_per_node})


def _optimizer_of(label: str, config: dict) -> str:
    return split_label(label)[1] or config.get("optimizer", "adamw")


def matching_trial(record, plan_config, precision: str, param_count: Callable[[], int]):
    """The finished trial of ``record`` that ran what the plan traces for ``precision``."""
    config = record.config if isinstance(record.config, dict) else {}
    if (_model_key(config.get("model", "")) != _model_key(plan_config.model)
            or _shape(config) != plan_shape(plan_config)):
        return None
    optimizer = split_label(precision)[1] or plan_config.optimizer
    for trial in record.trials:
        if (trial.precision == precision and trial.status == "ok"
                and trial.source == "profile" and trial.memory is not None
                and _optimizer_of(trial.precision, config) == optimizer
                and trial.param_count == param_count()):
            return trial
    return None


def read_report(path: str) -> object:
    """A run named with ``--measured``: a JSON report or a journal. Raises ``ValueError``
    with what to do when it is neither."""
    from engine.record.journal import read_run

    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--measured '{path}' is not a file: name a JSON report or a run "
                         "journal (.jsonl) written by `profile`")
    try:
        return read_run(file)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--measured '{path}' cannot be read as a report or journal: "
                         f"{exc}") from None


def _history(model: str, precision: str) -> Iterable[tuple[Path, object]]:
    """Journaled runs that may hold ``precision`` of ``model``, newest first, read lazily;
    a damaged or unreadable journal is skipped (History says what is wrong with it)."""
    from engine.record.journal import journal_entries, read_journal

    key = _model_key(model)
    for entry in journal_entries():
        if entry.status == "damaged" or precision not in entry.precisions:
            continue
        if _model_key(entry.model) != key:
            continue
        try:
            yield entry.path, read_journal(entry.path)
        except (OSError, ValueError):
            continue


def find_measured(plan_config, precision: str, param_count: Callable[[], int],
                  reports: Iterable[tuple[str, object]] = ()) -> MeasuredTrial | None:
    """The measured trial to show beside ``precision``'s traced one, or None."""
    from itertools import chain

    history = _history(plan_config.model, precision) if plan_config.history else ()
    for source, record in chain(reports, history):
        trial = matching_trial(record, plan_config, precision, param_count)
        if trial is not None:
            summary = getattr(trial, "summary", None)
            return MeasuredTrial(str(source), record.run_id, trial.device, trial.memory,
                                 getattr(summary, "median_step_ms", None))
    return None
