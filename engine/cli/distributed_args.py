"""``profile``'s options for distributed trials (torchrun), and the RunConfig keywords
they give."""

from __future__ import annotations

import argparse

from engine.core.config import STRATEGIES, TORCHRUN_FLAGS


def add_distributed_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "distributed (torchrun)",
        "each trial runs under torchrun: gloo on the CPU, NCCL on CUDA (one GPU per rank). "
        "--batch-size is per rank. A precision may end in @bf16/@fp16/@fp32: the dtype "
        "gradients are reduced in (e.g. fp32@bf16, bf16-amp@bf16)")
    g.add_argument("--strategy", default="none", choices=STRATEGIES,
                   help="none: one process (default); ddp; fsdp2 (fully_shard)")
    g.add_argument("--nproc-per-node", type=int, default=1, help="ranks on this machine")
    g.add_argument("--stall-timeout", type=float, default=None, metavar="SECONDS",
                   help="after the first step, end a trial whose ranks make no step for this "
                        "long, naming the rank (default: 20x the median step, at least 300 s)")
    for flag in TORCHRUN_FLAGS:
        g.add_argument(flag, dest="torchrun_" + flag[2:].replace("-", "_"), metavar="VALUE",
                       help="passed to torchrun unchanged (multi-node)")


def distributed_config(args: argparse.Namespace) -> dict:
    """RunConfig keywords from the parsed options."""
    passthrough = tuple(f"{flag}={getattr(args, 'torchrun_' + flag[2:].replace('-', '_'))}"
                        for flag in TORCHRUN_FLAGS
                        if getattr(args, "torchrun_" + flag[2:].replace("-", "_")) is not None)
    return {"strategy": args.strategy, "nproc_per_node": args.nproc_per_node,
            "torchrun_args": passthrough, "stall_timeout_s": args.stall_timeout}
