"""torchrun for one trial: ``python -m engine.distributed.launch DIR``.

This is ``torch.distributed.run`` itself: its own argument parser reads the torchrun
options (``--nproc-per-node``, and ``--nnodes`` / ``--rdzv-*`` / ``--node-rank`` passed
through from the command line) and its ``run`` starts ``engine.distributed.rank_main``
once per rank through ``elastic_launch``. The only difference from the ``torchrun``
script: the first failed rank is written to ``DIR/failure.json``, not only printed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def torchrun_argv(nproc_per_node: int, passthrough: list[str], out_dir: str) -> list[str]:
    # --standalone (a local rendezvous on a free port) unless the user set rendezvous up:
    # two runs on one machine then never collide on torchrun's fixed default port
    rendezvous = passthrough or ["--standalone"]
    return [f"--nproc-per-node={nproc_per_node}", *rendezvous, "--max-restarts=0",
            "--monitor-interval=0.1", "-m", "engine.distributed.rank_main", out_dir]


def main() -> int:
    import signal

    from engine.core.child import end_with_parent

    # SIGTERM, not SIGKILL: torchrun's agent stops its ranks on SIGTERM before it exits
    end_with_parent(signal.SIGTERM)
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    out_dir = Path(sys.argv[1])
    spec = json.loads((out_dir / "spec.json").read_text(encoding="utf-8"))
    config = spec["config"]
    args = get_args_parser().parse_args(
        torchrun_argv(config["nproc_per_node"], list(config["torchrun_args"]), str(out_dir)))
    try:
        run(args)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        (out_dir / "failure.json").write_text(json.dumps(
            {"rank": rank, "local_rank": failure.local_rank, "exitcode": failure.exitcode,
             "message": failure.message}), encoding="utf-8")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
