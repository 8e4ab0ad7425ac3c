"""Which rank of which launch a Recorder runs in under torchrun, and the record of all of a
launch's ranks.

Under torchrun every rank records, one journal each (named by its rank) under one run id
that every rank derives alike, so that rank 0's report merges them; outside torchrun a
process is rank 0 of 1.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from pathlib import Path

import torch

from engine.record.run_record import RunRecord

RANKS_WAIT_S = 60.0  # rank 0's report waits this long for the other ranks' journals to end


def rank_and_world() -> tuple[int, int]:
    """This process's rank and the world size: the process group's once it exists, else
    torchrun's environment (RANK, WORLD_SIZE); (0, 1) outside torchrun."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    try:
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    except ValueError:
        return 0, 1


def shared_run_id(world: int) -> str:
    """A new run id, the same on every rank of one torchrun launch without a collective (a
    Recorder made on rank 0 alone must not wait for the others): derived from what torchrun
    gives all the ranks of the launch (its run id, rendezvous address and port, restart
    count), and, where the run id is torchrun's default "none", from the launcher's pid,
    which one node's ranks share."""
    if world <= 1:
        return uuid.uuid4().hex[:12]
    launch = os.environ.get("TORCHELASTIC_RUN_ID", "")
    parts = [launch, *(os.environ.get(k, "") for k in (
        "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"))]
    if launch in ("", "none"):
        parts.append(str(os.getppid()))
    return hashlib.sha1("/".join(parts).encode()).hexdigest()[:12]


def strategy(model: torch.nn.Module) -> str:
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return "ddp"
    if type(model).__name__.startswith("FSDP"):  # fully_shard's class: FSDP<the model's>
        return "fsdp2"
    if type(model).__name__ == "FullyShardedDataParallel":
        return "fsdp"
    return "none (each rank trains its own model)"


def all_ranks(journal_file: Path) -> RunRecord:
    """Every rank's journal of the launch ``journal_file`` belongs to, merged, once they
    have all ended (or RANKS_WAIT_S has passed: what is there). A rank's journal exists
    from its Recorder's start, so a rank that records none (a loop that records on rank 0
    alone) is not waited for."""
    from engine.record.journal import journal_entry, read_run
    from engine.record.rank_journals import rank_journals

    deadline = time.monotonic() + RANKS_WAIT_S
    while time.monotonic() < deadline:
        paths = rank_journals(journal_file)
        entries = [journal_entry(p) for p in paths]
        if all(e is not None and e.status != "running" for e in entries):
            break
        time.sleep(0.2)
    return read_run(journal_file)
