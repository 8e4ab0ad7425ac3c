"""A user's own DDP/FSDP loop under torchrun: one Recorder journal per rank, read as one run.

Each rank journals to ``<name>.rank<k>.jsonl`` with the run id they share. Reading any of
them reads them all, merged as the engine's distributed trials merge their ranks
(engine/distributed/trial.py): a step is there once every rank has it; its time is the
slowest rank's (a synchronous step waits for it) and so is its time split; its loss is the
ranks' mean, its tokens their sum; lr and grad norm are rank 0's (gradients are reduced,
so every rank steps with the same ones). Each rank keeps its own steps and memory in
``TrialResult.ranks``.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import replace
from pathlib import Path

from engine.core.events import (
    DistributedSummary,
    RankMemory,
    RankResult,
    StepSample,
    TrialResult,
)
from engine.record.run_record import RunRecord
from engine.record.spread import step_spread

_RANK_NAME = re.compile(r"^(?P<base>.+)\.rank(?P<rank>\d+)$")


def rank_journal_path(path: Path, rank: int) -> Path:
    """Where rank ``rank`` of a run journals, beside ``path``: run.jsonl -> run.rank1.jsonl."""
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def rank_of(path: Path) -> int | None:
    """The rank a journal's name says it holds, or None for a one-process journal."""
    found = _RANK_NAME.match(Path(path).stem)
    return int(found["rank"]) if found else None


def rank_journals(path: Path) -> list[Path]:
    """Every rank's journal of the run ``path`` (one rank's journal) belongs to, by rank."""
    path = Path(path)
    base = _RANK_NAME.match(path.stem)["base"]
    found = {rank_of(p): p for p in path.parent.glob(f"{base}.rank*{path.suffix}")
             if rank_of(p) is not None and _RANK_NAME.match(p.stem)["base"] == base}
    return [found[r] for r in sorted(found)]


def _mean(values: list) -> float | None:
    return None if not values or None in values else sum(values) / len(values)


def merged_step(steps: list[StepSample]) -> StepSample:
    """One step of the run from the same step of every rank (rank 0 first)."""
    slowest = max(steps, key=lambda s: s.step_ms)
    tokens = [s.tokens for s in steps]
    total = sum(tokens) if None not in tokens else None
    seconds = slowest.step_ms / 1e3

    def global_rate(field: str) -> float | None:
        # each rank's rate over its own time, as work done, over the slowest rank's time
        rates = [getattr(s, field) for s in steps]
        return (None if None in rates or seconds <= 0
                else _mean([r * s.step_ms for r, s in zip(rates, steps)]) / slowest.step_ms)

    allocated = [s.allocated_bytes for s in steps if s.allocated_bytes is not None]
    reserved = [s.reserved_bytes for s in steps if s.reserved_bytes is not None]
    tflops = [s.tflops for s in steps]
    return replace(
        steps[0], step_ms=slowest.step_ms, warmup=any(s.warmup for s in steps),
        loss=_mean([s.loss for s in steps]), tokens=total,
        tokens_per_s=total / seconds if total is not None and seconds > 0 else None,
        tflops=None if None in tflops or seconds <= 0 else sum(
            t * s.step_ms for t, s in zip(tflops, steps)) / slowest.step_ms,
        mfu=global_rate("mfu"), hfu=global_rate("hfu"),
        allocated_bytes=max(allocated) if allocated else None,
        reserved_bytes=max(reserved) if reserved else None,
        skipped=any(s.skipped for s in steps), time_s=slowest.time_s,
        data_ms=slowest.data_ms, forward_ms=slowest.forward_ms,
        backward_ms=slowest.backward_ms, optimizer_ms=slowest.optimizer_ms)


def _rank_memory(trial: TrialResult) -> RankMemory | None:
    m = trial.memory
    if m is None:
        return None
    return RankMemory(sharded_params_bytes=m.params_bytes, unsharded_params_bytes=None,
                      grads_bytes=m.grads_bytes, optimizer_bytes=m.optimizer_bytes,
                      activations_bytes=m.activations_bytes, comm_buffers_bytes=None,
                      peak_allocated_bytes=m.peak_allocated_bytes, total_bytes=m.total_bytes,
                      total_method=m.total_method)


def _merged_trial(record: RunRecord, trials: list[TrialResult], configs: list[dict],
                  strategy: str) -> TrialResult:
    first = trials[0]
    count = min(len(t.steps) for t in trials)
    steps = [merged_step([t.steps[i] for t in trials]) for i in range(count)]
    ranks = [RankResult(rank=k, local_rank=config.get("local_rank", k),
                        host=config.get("host", ""), pid=config.get("pid", 0),
                        status="ok" if t.status == "ok" else t.status, reason=t.reason,
                        steps=list(t.steps), memory=_rank_memory(t),
                        median_step_ms=t.summary.median_step_ms if t.summary else None,
                        tokens_per_s=t.summary.tokens_per_s if t.summary else None)
             for k, (t, config) in enumerate(zip(trials, configs))]
    medians = [(r.median_step_ms, r.rank) for r in ranks if r.median_step_ms]
    slow, fast = (max(medians), min(medians)) if medians else ((None, None), (None, None))
    totals = [r.memory.total_bytes for r in ranks if r.memory is not None]
    measured = [s for s in steps if not s.warmup]
    timed = [s for s in measured if not s.skipped]

    def median(field: str):
        values = [getattr(s, field) for s in timed]
        return statistics.median(values) if values and None not in values else None

    tokens = [s.tokens for s in measured]
    summary = first.summary and replace(
        first.summary, steps_measured=len(measured), median_step_ms=median("step_ms"),
        tokens_per_s=median("tokens_per_s"), tflops=median("tflops"), mfu=median("mfu"),
        hfu=median("hfu"), peak_memory_bytes=max(totals) if totals else None,
        peak_memory_method="the largest rank's: " + first.summary.peak_memory_method,
        skipped_steps=sum(1 for s in steps if s.skipped),
        final_loss=steps[-1].loss if steps else None,
        spread=(step_spread(steps, tokens[0])
                if tokens and None not in tokens and len(set(tokens)) == 1 else None),
        hardware_tflops=None)
    failed = next((t for t in trials if t.status != "ok"), None)
    world = len(trials)
    environment = record.environment.get("device", {}) if isinstance(
        record.environment, dict) else {}
    backend = "nccl" if isinstance(environment, dict) and environment.get("kind") == "cuda" \
        else "gloo"
    distributed = DistributedSummary(
        strategy=strategy, world_size=world, nproc_per_node=world, backend=backend,
        sharded="parameters, gradients and optimizer state" if strategy == "fsdp2" else
        "nothing (DDP: every rank holds the whole model)", collectives={},
        slowest_rank=slow[1], slowest_step_ms=slow[0], fastest_step_ms=fast[0],
        step_spread_pct=100 * (slow[0] - fast[0]) / fast[0] if medians else None,
        max_memory_bytes=max(totals) if totals else None,
        min_memory_bytes=min(totals) if totals else None,
        total_tokens_per_s=summary.tokens_per_s if summary else None,
        comm_method="n/a: a user's own loop (collectives are not counted)",
        comm_time_reason="not measured in a user's own loop",
        failed_rank=trials.index(failed) if failed else None)
    return replace(
        first, steps=steps, summary=summary, ranks=ranks, distributed=distributed,
        status=failed.status if failed else first.status,
        reason=(f"rank {trials.index(failed)}: {failed.reason}" if failed else first.reason),
        device=f"{world} ranks on {first.device}",
        notes=[*first.notes, f"{world} ranks merged ({strategy}): a step's time is the "
               "slowest rank's, its loss the ranks' mean, its tokens their sum; lr and grad "
               "norm are rank 0's"])


def merge_ranks(records: list[RunRecord]) -> RunRecord:
    """One run from its ranks' records (rank 0 first); raises ``ValueError`` when they are
    not one run's."""
    ids = {r.run_id for r in records}
    if len(ids) != 1:
        raise ValueError(f"the rank journals hold different runs ({', '.join(sorted(ids))}): "
                         "keep only one run's <name>.rank<k>.jsonl files together")
    first = records[0]
    strategy = first.config.get("strategy") or "ddp"
    trials = []
    for trial in first.trials:
        per_rank = [r.trial(trial.precision) for r in records]
        trials.append(_merged_trial(first, per_rank, [r.config for r in records], strategy)
                      if None not in per_rank else trial)
    ended = [r for r in records if r.finished_s is not None]
    status = next((r.status for r in records if r.status != "ok"), first.status)
    return replace(first, trials=trials, status=status,
                   finished_s=max(r.finished_s for r in ended) if len(ended) == len(records)
                   else None,
                   config={**first.config, "world_size": len(records)})


def read_rank_journals(path: Path, read_journal) -> RunRecord:
    """Every rank of the run that ``path`` (one rank's journal) belongs to, merged."""
    return merge_ranks([read_journal(p) for p in rank_journals(path)])
