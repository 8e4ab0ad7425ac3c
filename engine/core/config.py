"""Run configuration: frozen dataclasses that validate themselves.

Every check raises ``ValueError`` with a sentence that says how to fix the input, so
the CLI can print it as one line and the window can show it inline.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

# any step index or step count: the config's limit, which the journal reader also holds
# events to (here, below the reader, so the two cannot import each other)
MAX_STEPS = 10_000_000

PRECISIONS: tuple[str, ...] = (
    "fp32",
    "tf32",
    "fp16-amp",
    "bf16-amp",
    "fp16",
    "bf16",
    "int8",
    "nf4",
    "fp8",
    "fp8-rowwise",
    "fp8-rowwise-gw-hp",
    "mxfp8",
    "nvfp4",
    "fp8-fsdp-ag",
)
# recipes that only mean something when FSDP2 shards the parameters
FSDP2_ONLY: tuple[str, ...] = ("fp8-fsdp-ag",)
# formats people ask for that this torchao cannot train: the n/a reason a pick of one gets
NOT_TRAINABLE: dict[str, str] = {
    "mxfp4": "n/a: torchao 0.18 has no MXFP4 training recipe (its MX training config, "
             "MXFP8TrainingOpConfig, takes float8 e4m3 elements only; MXFP4 exists there only "
             "as QAT fake quantisation, whose backward runs in high precision): choose mxfp8 "
             "or nvfp4",
}
# recipes whose matmuls run in bf16: emulated, and slow, on a CPU without bf16 units
BF16_COMPUTE: tuple[str, ...] = ("bf16-amp", "bf16", "nf4")
BF16_EMULATED = "emulated (no AVX512-BF16/AMX), slow"  # the device's bf16, said so
# what a run compares when no precision is named: fp32 and the half-precision autocast
# recipes (the CLI's --precision default; the window ticks those its device runs natively)
DEFAULT_PRECISIONS: tuple[str, ...] = ("fp32", "bf16-amp", "fp16-amp")
OPTIMIZERS: tuple[str, ...] = ("adamw", "sgd", "adamw8bit")  # --optimizer: the whole run
# the "+optim" suffix of a precision: its trial's optimiser (and state precision); torchao's
# low-bit AdamWs (torchao.optim, 0.18) and AdamW with bf16 state and bf16 stochastic rounding,
# whose step torchao compiles with torch.compile
TORCHAO_STEP: tuple[str, ...] = ("adamw8bit-ao", "adamw4bit", "adamw-fp8", "adamw-bf16-sr")
STATE_OPTIMIZERS: tuple[str, ...] = OPTIMIZERS + TORCHAO_STEP
ISOLATIONS: tuple[str, ...] = ("process", "inline")
STRATEGIES: tuple[str, ...] = ("none", "ddp", "fsdp2")  # "none": one process, no torchrun
REDUCE_DTYPES: tuple[str, ...] = ("fp32", "bf16", "fp16")  # the "@dtype" suffix (distributed)
# torchrun options passed through unchanged for multi-node runs (see README, headless use)
TORCHRUN_FLAGS: tuple[str, ...] = ("--nnodes", "--node-rank", "--rdzv-backend", "--rdzv-endpoint",
                                   "--rdzv-id", "--master-addr", "--master-port")
INTERLEAVE: tuple[str, ...] = ("auto", "on", "off")  # see engine/run/rounds.py
# the ":keep-..." suffix of a recipe: Linear layers left in high precision while the rest
# are converted (torchao's module filter); the recipes whose conversion takes that filter
KEEP_HIGH: tuple[str, ...] = ("keep-ends", "keep-attn")
PER_LAYER_RECIPES: tuple[str, ...] = ("fp8", "fp8-rowwise", "fp8-rowwise-gw-hp")
# ":auto": convert only the layers the payoff model (engine/measure/fp8_payoff.py) predicts
# to pay on the card; the recipes it has a calibrated model for (engine/run/fp8_auto.py)
AUTO = "auto"
AUTO_RECIPES: tuple[str, ...] = ("fp8", "fp8-rowwise")
# --data: the built-in text (engine/models/corpus.py), uniform random tokens, or a file's path
DATA_DOCS, DATA_RANDOM = "docs", "random"
DATA_HINT = ("pass a UTF-8 text file, token ids as a .bin (nanoGPT's uint16) or a 1-D integer "
             f".npy, {DATA_DOCS} (the built-in text) or {DATA_RANDOM}")


def split_label(label: str) -> tuple[str, str | None, str]:
    """``"bf16-amp+adamw8bit@bf16"`` -> (recipe, optimiser or None, reduce dtype or "")."""
    name, _, reduce = label.partition("@")  # "fp32@bf16": gradients reduced in bf16
    name, plus, optim = name.partition("+")
    return name, optim if plus else None, reduce


def split_keep(name: str) -> tuple[str, str | None]:
    """``"fp8:keep-attn"`` -> ("fp8", "keep-attn"); a recipe without the suffix -> (name, None)."""
    base, colon, keep = name.partition(":")
    return base, keep if colon else None


def recipe_name(label: str) -> str:
    """The table recipe a label builds on, every suffix dropped: "fp8:keep-ends+sgd" -> "fp8"."""
    return split_keep(split_label(label)[0])[0]


def default_precisions(device=None) -> tuple[str, ...]:
    """``DEFAULT_PRECISIONS``, less the autocast recipes ``device`` (an engine.measure.device
    .DeviceInfo, not imported: core is below measure; None: not probed yet) does
    not run natively: unsupported, emulated, or bf16 on a CPU without bf16 units (slower than
    fp32 there, so never the answer on speed, and the default run should stay short)."""
    if device is None:
        return DEFAULT_PRECISIONS

    def native(precision: str) -> bool:
        verdict = device.verdict(precision)
        return (verdict is not None and verdict.support == "native"
                and not (precision in BF16_COMPUTE and device.bf16_hardware is False))

    return ("fp32", *(p for p in DEFAULT_PRECISIONS[1:] if native(p)))


def base_precision(label: str) -> str:
    """The recipe a trial label trains in, its optimiser and reduction suffixes dropped."""
    return split_label(label)[0]


def parse_precisions(text: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Turn ``"fp32,bf16-amp+adamw8bit"`` (or a list) into a validated tuple, keeping order."""
    items = text.split(",") if isinstance(text, str) else list(text)
    names = [item.strip().lower() for item in items if item.strip()]
    if not names:
        raise ValueError(f"no precision given: choose from {', '.join(PRECISIONS)}")
    for label in names:
        name, optim, reduce = split_label(label)
        name, keep = split_keep(name)
        if keep == AUTO and name not in AUTO_RECIPES:
            raise ValueError(f"'{label}': ':auto' follows one of {', '.join(AUTO_RECIPES)} "
                             "(the recipes with a calibrated payoff model), e.g. "
                             "fp8-rowwise:auto")
        if keep not in (None, AUTO) and (keep not in KEEP_HIGH or name not in PER_LAYER_RECIPES):
            raise ValueError(f"'{label}': a ':keep-...' suffix takes one of "
                             f"{', '.join(':' + k for k in KEEP_HIGH)} after one of "
                             f"{', '.join(PER_LAYER_RECIPES)}, e.g. fp8:keep-ends")
        if reduce and reduce not in REDUCE_DTYPES:
            raise ValueError(f"unknown gradient-reduction dtype '@{reduce}': "
                             f"use one of {', '.join('@' + d for d in REDUCE_DTYPES)}")
        if name in NOT_TRAINABLE:
            raise ValueError(f"{name}: {NOT_TRAINABLE[name]}")
        if name not in PRECISIONS:
            raise ValueError(
                f"unknown precision '{name}': choose from {', '.join(PRECISIONS)}"
            )
        if optim is not None and optim not in STATE_OPTIMIZERS:
            raise ValueError(f"unknown optimizer '+{optim}' in '{label}': write RECIPE+OPTIM "
                             f"with OPTIM one of {', '.join(STATE_OPTIMIZERS)}")
    if len(set(names)) != len(names):
        raise ValueError("a precision is listed twice: name each precision once")
    return tuple(names)


def _positive_int(name: str, value: int, flag: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a whole number of 1 or more (got {value!r}): set {flag}")


def _data_source(value) -> str:
    """``--data`` as the run keeps it: a keyword, or a readable, non-empty file's absolute
    path (trials may run elsewhere in the tree: torchrun's ranks, a server's children)."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"no training data given (--data): {DATA_HINT}")
    text = value.strip()
    if text in (DATA_DOCS, DATA_RANDOM):
        return text
    path = Path(text).expanduser()
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise ValueError(f"data file {text} {what}: {DATA_HINT}")
    if not os.access(path, os.R_OK):
        raise ValueError(f"data file {text} cannot be read (permission denied): {DATA_HINT}")
    if path.stat().st_size == 0:
        raise ValueError(f"data file {text} is empty: {DATA_HINT}")
    return str(path.resolve())


def _step_count(name: str, value: int, flag: str, least: int) -> None:
    """A number of steps a report can hold: a run is refused up front, not its report after
    hours of training."""
    if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= MAX_STEPS:
        raise ValueError(f"{name} must be a whole number from {least} to {MAX_STEPS:,} "
                         f"(got {value!r}): set {flag}")


# A trial's first step compiles (torch.compile, torchao), autotunes (cuBLAS, Triton) and
# allocates (optimiser state, the caching allocator's blocks) for the first time: on an H200
# an eager fp8 trial's first step took 212 ms beside 115-167 ms after it. A median never
# includes it, so every trial (every round) warms up at least this many steps; "--warmup 0"
# still runs one, and the trial's notes say so.
MIN_WARMUP = 1
WARMUP_RAISED_NOTE = ("--warmup 0: one warm-up step ran anyway (a trial's first step "
                      "compiles, autotunes and allocates for the first time, so no median "
                      "includes it)")


def warmup_steps(warmup: int) -> int:
    """The warm-up steps a trial runs for the configured ``--warmup``."""
    return max(warmup, MIN_WARMUP)


@dataclass(frozen=True)
class RunConfig:
    """Everything one run needs. ``model`` is a preset name, a folder path or a hub id."""

    model: str = "tiny"
    precisions: tuple[str, ...] = ("fp32",)
    batch_size: int = 4
    seq_len: int = 128
    steps: int = 10
    warmup: int = 2
    grad_accum: int = 1
    optimizer: str = "adamw"
    lr: float = 1e-4
    grad_checkpointing: bool = False
    compile: bool = False
    init_scale: float = 2.0**16
    growth_interval: int = 2000
    lora_r: int = 8
    device: str = "auto"
    isolation: str = "process"
    seed: int = 0
    trust_remote_code: bool = False
    monitor_hz: float = 10.0
    profile_step: bool = True  # one extra step under torch.profiler after the measured ones
    trace_dir: str | None = None  # where that step's Chrome trace (and CUDA snapshot) go
    strategy: str = "none"
    nproc_per_node: int = 1
    # a distributed trial whose ranks make no step for this long is ended as an error
    # naming the rank; None: STALL_FACTOR x the median step, at least STALL_FLOOR_S
    stall_timeout_s: float | None = None
    torchrun_args: tuple[str, ...] = ()
    interleave: str = "auto"  # ABBA rounds of the precisions; auto: where trials are cheap
    rounds: int = 2
    extra: dict = field(default_factory=dict, compare=False)
    # the run's seeded fp32 initial weights, which the runner draws once and hands each
    # trial (engine.models.initial_weights); None: a trial draws its own
    initial_weights: str | None = None
    quant_error: bool = True  # the untimed forward that measures each layer's SQNR
    # whether this trial is its precision's last round (engine/run/rounds.py): only that
    # round's memory step, held-out loss and lost updates are kept, so earlier rounds skip them
    last_round: bool = True
    # what the trials train and measure held-out loss on: DATA_DOCS, DATA_RANDOM or a file
    data: str = DATA_DOCS
    # the card whose payoff table an ":auto" recipe converts by (--card); None: the GPU the
    # trial runs on (engine/run/fp8_auto.py)
    payoff_card: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError("no model given: pass a preset name, a folder or a hub id (--model)")
        object.__setattr__(self, "precisions", parse_precisions(self.precisions))
        _positive_int("batch size", self.batch_size, "--batch-size")
        _positive_int("sequence length", self.seq_len, "--seq-len")
        _step_count("steps", self.steps, "--steps", 1)
        _positive_int("gradient accumulation", self.grad_accum, "--grad-accum")
        _positive_int("growth interval", self.growth_interval, "--growth-interval")
        _positive_int("LoRA rank", self.lora_r, "--lora-r")
        _step_count("warm-up", self.warmup, "--warmup", 0)
        object.__setattr__(self, "data", _data_source(self.data))
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"unknown optimizer '{self.optimizer}': choose from {', '.join(OPTIMIZERS)}"
            )
        if not self.lr > 0 or not math.isfinite(self.lr):
            raise ValueError(f"learning rate must be a finite number above 0 (got {self.lr!r}): "
                             "set --lr")
        if not self.init_scale > 0 or not math.isfinite(self.init_scale):
            raise ValueError(f"initial loss scale must be a finite number above 0 "
                             f"(got {self.init_scale!r}): set --init-scale")
        if self.isolation not in ISOLATIONS:
            raise ValueError(
                f"unknown isolation '{self.isolation}': choose from {', '.join(ISOLATIONS)}"
            )
        dev = self.device.strip().lower()
        if not (dev in ("auto", "cpu", "cuda") or (dev.startswith("cuda:") and dev[5:].isdigit())):
            raise ValueError(f"unknown device '{self.device}': use auto, cpu, cuda or cuda:N")
        object.__setattr__(self, "device", dev)
        if not self.monitor_hz > 0 or not math.isfinite(self.monitor_hz):
            raise ValueError("monitor rate must be above 0 Hz")
        if self.interleave not in INTERLEAVE:
            raise ValueError(f"unknown interleave setting '{self.interleave}': choose from "
                             f"{', '.join(INTERLEAVE)} (--interleave)")
        if not isinstance(self.rounds, int) or isinstance(self.rounds, bool) or self.rounds < 2:
            raise ValueError(f"rounds must be a whole number of 2 or more (got {self.rounds!r}): "
                             "set --rounds, or --interleave off for one round")
        if self.interleave == "on" and len(self.precisions) > 1 and self.steps < self.rounds:
            raise ValueError(f"{self.rounds} interleaved rounds need at least {self.rounds} "
                             f"measured steps (one per round; got {self.steps}): raise --steps "
                             "or lower --rounds")
        self._check_distributed()
        compiled_step = [p for p in self.precisions if split_label(p)[1] in TORCHAO_STEP]
        if compiled_step and self.warmup < 1:
            raise ValueError(f"{compiled_step[0]}: torchao compiles its optimizer step on the "
                             "first step, which would be timed as a measured step: set "
                             "--warmup 1 or more")
        if self.compile and self.warmup < 1:
            raise ValueError(
                "--compile needs at least one warm-up step, or compilation would be timed as "
                "a measured step: set --warmup 1 or more"
            )

    def _check_distributed(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"unknown strategy '{self.strategy}': choose from {', '.join(STRATEGIES)}"
            )
        _positive_int("processes per node", self.nproc_per_node, "--nproc-per-node")
        stall = self.stall_timeout_s
        if stall is not None and (isinstance(stall, bool) or not isinstance(stall, int | float)
                                  or not 0 < stall <= 7 * 86400):
            raise ValueError(f"the stall timeout must be above 0 and at most a week in seconds "
                             f"(got {stall!r}): set --stall-timeout")
        object.__setattr__(self, "torchrun_args", tuple(self.torchrun_args))
        auto = [p for p in self.precisions if split_keep(split_label(p)[0])[1] == AUTO]
        if auto and self.strategy != "none":
            raise ValueError(f"{auto[0]}: ':auto' recipes run in one process: leave out "
                             "--strategy, or name the layers with :keep-ends or :keep-attn")
        fsdp_only = [p for p in self.precisions if base_precision(p) in FSDP2_ONLY]
        if fsdp_only and self.strategy != "fsdp2":
            raise ValueError(f"{fsdp_only[0]} all-gathers FSDP2's sharded parameters in float8: "
                             "run it with --strategy fsdp2 (and --nproc-per-node), or choose fp8")
        if self.strategy == "none":
            if self.nproc_per_node > 1 or self.torchrun_args:
                raise ValueError("several processes need a strategy: set --strategy ddp or fsdp2")
            if any("@" in p for p in self.precisions):
                raise ValueError("a gradient-reduction dtype ('@bf16') needs a distributed run: "
                                 "set --strategy ddp or fsdp2, or drop the '@' suffix")
            return
        # the ranks build the run's --optimizer (engine/distributed/rank_main.py), and
        # bitsandbytes' 8-bit state does not shard into FSDP2's DTensors
        if any("+" in p for p in self.precisions):
            raise ValueError("a per-trial optimizer ('+adamw8bit') runs in one process only: "
                             "drop the '+' suffix and use --optimizer, or --strategy none")
        for arg in self.torchrun_args:
            if arg.partition("=")[0] not in TORCHRUN_FLAGS or "=" not in arg:
                raise ValueError(f"torchrun option '{arg}' is not passed through: use "
                                 f"{', '.join(f + '=VALUE' for f in TORCHRUN_FLAGS)}")
        if self.device.startswith("cuda:"):
            raise ValueError("a distributed run gives each rank its own GPU (cuda:LOCAL_RANK): "
                             "use --device cuda or cpu")
        if self.isolation == "inline":
            raise ValueError("distributed ranks are torchrun's processes: drop --isolation "
                             "inline or the strategy")
        if self.compile:
            raise ValueError("distributed trials do not torch.compile the model yet: drop "
                             "--compile or the strategy")
        # each distributed trial is a torchrun launch: precisions run one after another
        if self.interleave == "on":
            raise ValueError("distributed trials are not interleaved: drop --interleave on "
                             "or the strategy")
        object.__setattr__(self, "interleave", "off")

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len * self.grad_accum

    def replace(self, **changes) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["precisions"] = list(self.precisions)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> RunConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        if "precisions" in kwargs:
            kwargs["precisions"] = tuple(kwargs["precisions"])
        if "torchrun_args" in kwargs:
            kwargs["torchrun_args"] = tuple(kwargs["torchrun_args"])
        return cls(**kwargs)
