"""What a plan is asked: the model, the recipes, the shape, the cards, the strategy
(``PlanConfig``, checked as it is made), and the optimiser each recipe's step builds. Kept
apart from engine.run.plan so the step's trace (engine.run.plan_trace) reads it without
importing the plan that runs the trace."""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.config import (
    FSDP2_ONLY,
    OPTIMIZERS,
    STRATEGIES,
    RunConfig,
    base_precision,
    parse_precisions,
    split_label,
)
from engine.measure.peaks import _entry as peak_entry
from engine.measure.peaks import table
from engine.record.bounded import cut

# What CUDA holds outside the allocator (context, loaded kernels, cuBLAS handles); a
# stated allowance, not a measurement: `profile` on the card reports its context gap.
CUDA_CONTEXT_BYTES = 1 << 30
DEFAULT_CARDS = ("RTX 4090", "H100 SXM")
MAX_BATCH = 64
TRACE_AS = ("card", "cpu")


@dataclass(frozen=True)
class PlanConfig:
    model: str = "tiny"
    precisions: tuple[str, ...] = ("fp32",)
    batch_size: int = 1
    seq_len: int = 128
    grad_checkpointing: bool = False
    grad_accum: int = 1  # micro-batches per optimiser step, gradients kept across them
    optimizer: str = "adamw"
    cards: tuple[str, ...] = DEFAULT_CARDS
    context_bytes: int = CUDA_CONTEXT_BYTES
    max_batch: int = MAX_BATCH  # 0: no search for the largest micro-batch
    strategy: str = "none"  # "fsdp2" or "ddp": the figure is one rank's at nproc_per_node
    nproc_per_node: int = 1
    # reports or journals to look in for measured trials, before the run history
    measured: tuple[str, ...] = ()
    history: bool = True  # look in the journaled runs of this machine for measured trials
    levers: bool = True  # plan the changes that would make it fit (engine.run.plan_answer)
    compile: bool = False  # the card runs the step compiled: the roofline's fused traffic
    # "card": autocast as the cards run it (CUDA's policy: every card in the table runs
    # torch's "cuda" device, ROCm's included); "cpu": as a CPU trial runs it
    trace_as: str = "card"
    # trace the whole model, not cut models scaled to its layer count (engine.run.plan_scale)
    full_trace: bool = False

    def __post_init__(self) -> None:
        from engine.models.presets import get_preset

        preset = get_preset(self.model)  # an alias ("llama2-7b") names its preset
        if preset is not None:
            object.__setattr__(self, "model", preset.name)
        # RunConfig validates the shared fields and says how to fix them
        self.run_config(self.batch_size)
        object.__setattr__(self, "precisions", parse_precisions(self.precisions))
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy '{self.strategy}': choose from "
                             f"{', '.join(STRATEGIES)}")
        if not isinstance(self.nproc_per_node, int) or self.nproc_per_node < 1:
            raise ValueError("--nproc-per-node must be 1 or more")
        from engine.run.fp8_auto import is_auto

        auto = [p for p in self.precisions if is_auto(p)]
        if auto:  # its layers differ per card, and the table below the plan lists them
            raise ValueError(f"{auto[0]} picks its layers per card: plan {auto[0].split(':')[0]} "
                             "(the fp8 payoff table below the plan says which layers pay on "
                             "each card), then profile it with --card")
        if self.strategy == "none":
            if self.nproc_per_node > 1:
                raise ValueError("several ranks need a strategy: set --strategy ddp or fsdp2")
            if any(split_label(p)[2] for p in self.precisions):
                raise ValueError("a gradient-reduction dtype ('@bf16') needs a distributed "
                                 "run: set --strategy ddp or fsdp2, or drop the '@' suffix")
            fsdp_only = [p for p in self.precisions if base_precision(p) in FSDP2_ONLY]
            if fsdp_only:
                raise ValueError(f"{fsdp_only[0]} all-gathers FSDP2's sharded parameters in "
                                 "float8: plan it with --strategy fsdp2 (and "
                                 "--nproc-per-node), or choose fp8")
        else:
            if any(split_label(p)[1] for p in self.precisions):
                raise ValueError("a per-trial optimizer ('+adamw8bit') runs in one process "
                                 "only, as in a distributed trial: drop the '+' suffix and use "
                                 "--optimizer, or --strategy none")
            from engine.distributed.recipes import unsupported_reason

            if self.strategy == "fsdp2" and self.grad_accum > 1:
                raise ValueError("--grad-accum with --strategy fsdp2 is not planned: FSDP2 "
                                 "keeps unsharded gradients between micro-batches, which the "
                                 "traced step does not run; plan one micro-batch")
            for label in self.precisions:
                name, _, reduce = split_label(label)
                why = unsupported_reason(f"{name}@{reduce}" if reduce else name, self.strategy)
                if why:
                    raise ValueError(why)
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer '{self.optimizer}': choose from "
                             f"{', '.join(OPTIMIZERS)}")
        if not self.cards:
            raise ValueError("no card given: name at least one, e.g. --card \"RTX 4090\"")
        for name in self.cards:
            if peak_entry(name) is None:
                known = ", ".join(g["name"] for g in table()["gpus"])
                raise ValueError(f"unknown card '{cut(name, 80)}': choose from {known}")
        if self.context_bytes < 0:
            raise ValueError("the CUDA context allowance cannot be negative")
        if self.max_batch < 0:
            raise ValueError("--max-batch must be 0 (no search) or more")
        if self.trace_as not in TRACE_AS:
            raise ValueError(f"unknown --trace-as '{self.trace_as}': choose from "
                             f"{', '.join(TRACE_AS)}")

    def run_config(self, batch_size: int) -> RunConfig:
        # the traced step is one process: an '@dtype' reduction is FSDP2's policy, not its;
        # fp8-fsdp-ag's float8 all-gather is FSDP2's too: one process trains it as fp8
        one_process = tuple(dict.fromkeys(
            "fp8" if base_precision(p) in FSDP2_ONLY else p.partition("@")[0]
            for p in parse_precisions(self.precisions)))
        return RunConfig(model=self.model, precisions=one_process, batch_size=batch_size,
                         seq_len=self.seq_len, optimizer=self.optimizer, device="cpu",
                         grad_checkpointing=self.grad_checkpointing,
                         grad_accum=self.grad_accum, isolation="inline")


def trial_optimizer(config: PlanConfig, precision: str) -> str:
    """The optimiser a trial label trains with: its '+OPTIM' suffix, else --optimizer."""
    return split_label(precision)[1] or config.optimizer
