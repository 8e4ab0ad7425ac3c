"""Plan a training step on a card this machine does not have, with fake tensors.

The model is built from its config under torch's ``FakeTensorMode``: every tensor has a
shape, dtype and storage size but no memory. One training step of each recipe then runs
for real (engine.models.load.load_model, engine.run.trial's optimiser, scaler and
``tracked_step``), so engine.measure.memtrack follows every allocation exactly as in a measured
trial and FlopCounterMode counts the step's FLOPs by dtype. Nothing is estimated: the
peak and its categories are those of the traced step.

The trace runs on the CPU device (a CPU build of torch cannot build an autograd graph on
fake CUDA tensors); an autocast recipe is traced under the target cards' autocast policy,
CUDA's (engine.run.plan_autocast), not the CPU's, unless ``trace_as="cpu"`` asks for what a
CPU trial runs. Attention takes the CPU's fused kernel, which keeps what CUDA's flash and
memory-efficient kernels keep for backward (the output and its log-sum-exp); what a CUDA
allocator adds (512-byte rounding, cuBLAS workspaces, the context) is covered by the
stated context allowance.

int8 and nf4 are traced as bitsandbytes runs them on the card (engine.run.plan_quant: fake
quantised weights of the sizes the card stores, LLM.int8's CUDA matmul). What fake tensors
cannot run (a custom op without a fake kernel) falls back to engine.models.memory_model, and
says so in the trial. ``--strategy fsdp2`` traces rank 0 on torch's fake process group;
DDP cannot run there, so its buckets are added to the one-process trace.

Per card, the step time is a roofline prediction: the longer of the step's FLOPs by dtype
at each dtype's datasheet peak and its bytes moved (engine.measure.traffic, counted over the
watched step) at the card's datasheet memory bandwidth, with the bound named. Where a real
trial of the same model and shape exists (the run history, or ``--measured``), its
figures stand beside the traced ones (engine.run.plan_measured).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import torch

from engine.core.config import (
    FSDP2_ONLY,
    base_precision,
    split_label,
)
from engine.core.events import MemoryBreakdown
from engine.measure import flops as flops_mod
from engine.measure.peaks import memory_bandwidth, peak_flops
from engine.measure.traffic import CONVENTION as TRAFFIC_CONVENTION
from engine.measure.traffic import FUSED_CONVENTION
from engine.run.plan_config import PlanConfig, trial_optimizer
from engine.run.plan_measured import MeasuredTrial, find_measured, read_report
from engine.run.plan_timeline import traced_timeline
from engine.run.plan_trace import traced_policy

TRACE_METHOD = ("traced: one training step on fake tensors (torch FakeTensorMode), every "
                "storage followed by engine.measure.memtrack from allocation to release; the "
                "largest sum of live bytes")


@dataclass(frozen=True)
class CardVerdict:
    card: str  # the table's name
    memory_bytes: int | None  # as the driver reports it (nvidia-smi); None: not in the table
    memory_source: str
    usable_bytes: int | None  # memory minus the context allowance
    fits: bool | None
    headroom_bytes: int | None  # usable minus the traced peak; negative: short by that much
    max_batch: int | None  # largest micro-batch that fits (0: not even 1), None: not searched
    max_batch_note: str
    predicted_step_ms: float | None  # roofline prediction, never a measurement
    prediction_model: str
    reason: str | None = None  # why fits/headroom are n/a
    bound: str | None = None  # the roofline's bound: "compute" or "memory"
    compute_ms: float | None = None  # FLOPs by dtype at each dtype's peak
    memory_ms: float | None = None  # bytes moved at the card's memory bandwidth
    # "cuda": memory_bytes is a printout of what CUDA reports; "datasheet": the nominal
    # capacity, more than CUDA reports (memory_source says by how much)
    memory_kind: str | None = None


@dataclass(frozen=True)
class PlanTrial:
    precision: str
    method: str  # "traced", "memory model" or "n/a"
    reason: str | None
    memory: MemoryBreakdown | None
    flops_by_peak_dtype: dict = field(default_factory=dict)
    trace_s: float | None = None
    cards: list = field(default_factory=list)  # CardVerdict per card
    optimizer: str = ""  # the label's '+OPTIM', else --optimizer
    # a real trial of the same model, shape and recipe (engine.run.plan_measured), or None
    measured: MeasuredTrial | None = None
    # engine.measure.traffic's count of the traced step; None: not traced
    bytes_moved: int | None = None
    # the same step's traffic when compiled (FUSED_CONVENTION), and whether the card runs the
    # recipe compiled (float8 is: it is fast only compiled), so its roofline uses that count
    bytes_moved_fused: int | None = None
    compiled: bool = False
    # the traced step's MemoryTimeline (engine.run.plan_timeline); None: not traced
    memory_timeline: object = None
    # the autocast op lists the trace followed (engine.run.plan_autocast); None: the recipe
    # has no autocast region (FSDP2 casts by its policy) or was not traced
    autocast_policy: str | None = None
    # how the step was traced: scaled from cut models, or whole and why (plan_scale)
    scaling: str | None = None


@dataclass(frozen=True)
class PlanResult:
    model: str
    batch_size: int
    seq_len: int
    grad_checkpointing: bool
    optimizer: str
    context_bytes: int
    trials: list = field(default_factory=list)
    kind: str = "plan"
    grad_accum: int = 1
    strategy: str = "none"
    nproc_per_node: int = 1
    # engine.run.plan_answer.CardAnswer per card: fits or not, and the smallest change
    answers: list = field(default_factory=list)
    # what the answer planned beyond the recipes asked: (recipe and change, card, PlanTrial)
    lever_trials: list = field(default_factory=list)


def meta_shape(config: PlanConfig, precision: str):
    """The memory model's ModelShape of the model a trial of ``precision`` trains, built on
    the meta device. A quantised recipe gets what loading does before any weight is read:
    transformers' bitsandbytes quantizer swaps the Linear layers (its own choice of which
    to keep), then engine.models.load adds the trial's LoRA adapters."""
    from engine.core.recipes import recipe
    from engine.models.load import (
        _add_lora,
        _bnb_config,
        dims,
        load_config,
        model_class,
        resolve_source,
    )
    from engine.models.memory_model import shape_of

    rec = recipe(base_precision(precision))
    model_config, task = load_config(resolve_source(config.model))
    with torch.device("meta"):
        model = model_class(task).from_config(model_config, dtype=rec.weight_dtype)
    if rec.quant:
        from transformers.quantizers import AutoHfQuantizer

        quantizer = AutoHfQuantizer.from_config(_bnb_config(rec), pre_quantized=False)
        quantizer.preprocess_model(model, dtype=rec.weight_dtype, device_map={"": "cpu"})
        model, _ = _add_lora(model, rec, config.run_config(1).lora_r, config.grad_checkpointing)
    return shape_of(model, model_config, dims(model_config))


def _fallback(config: PlanConfig, precision: str, batch_size: int) -> MemoryBreakdown:
    """engine.models.memory_model's prediction for a recipe fake tensors cannot trace."""
    from engine.core.recipes import recipe
    from engine.models.memory_model import predict_memory

    rec = recipe(base_precision(precision))
    shape = meta_shape(config, precision)
    p = predict_memory(rec, trial_optimizer(config, precision), shape, batch_size, config.seq_len,
                       config.grad_checkpointing, "cuda")
    at = p.at_peak_bytes  # the peak phase's terms, by category: they add up to the total
    return MemoryBreakdown(
        params_bytes=at["params"], grads_bytes=at["grads"],
        optimizer_bytes=at["optimizer"], activations_bytes=at["activations"],
        activations_method=p.activations_method, buffers_bytes=at["buffers"],
        quant_state_bytes=at["quant_state"], weight_copies_bytes=at["weight_copies"],
        inputs_bytes=at["inputs"], temporaries_bytes=at["temporaries"],
        total_bytes=p.total_bytes,
        total_method="predicted by engine.models.memory_model (calibrated), not traced",
        notes=p.formula, peak_phase=p.peak_phase)


def card_memory(card: str) -> tuple[str, int | None, str]:
    """(table name, memory as CUDA reports it, its source or why it is missing)."""
    from engine.measure.peaks import card_memory as lookup

    found = lookup(card)
    return found.name, found.memory_bytes, found.source


def _memory_kind(card: str) -> str | None:
    from engine.measure.peaks import card_memory as lookup

    return lookup(card).kind


@dataclass(frozen=True)
class Roofline:
    step_ms: float | None  # the larger of the two bounds; None: either is unknown
    compute_ms: float | None
    memory_ms: float | None
    bound: str | None  # "compute" or "memory"
    model: str  # how it was predicted, or why it is n/a


def roofline(card: str, by_peak_dtype: dict, bytes_moved: int | None,
             convention: str = TRAFFIC_CONVENTION) -> Roofline:
    """A roofline prediction: the step takes the longer of its FLOPs at each dtype's
    datasheet peak and its bytes moved (counted by ``convention``) at the card's datasheet
    memory bandwidth."""
    if not by_peak_dtype or bytes_moved is None:
        return Roofline(None, None, None, None, "n/a: the step was not traced")
    blend = flops_mod.blended_peak(by_peak_dtype, lambda key: peak_flops(card, key))
    bandwidth = memory_bandwidth(card)
    if blend.flops_per_s is None or bandwidth.bytes_per_s is None:
        why = blend.reason if blend.flops_per_s is None else bandwidth.source
        return Roofline(None, None, None, None, f"n/a: {why}")
    compute_ms = sum(by_peak_dtype.values()) / blend.flops_per_s * 1e3
    memory_ms = bytes_moved / bandwidth.bytes_per_s * 1e3
    bound = "compute" if compute_ms >= memory_ms else "memory"
    return Roofline(max(compute_ms, memory_ms), compute_ms, memory_ms, bound, (
        f"prediction (roofline, {bound}-bound: the larger of compute {compute_ms:.3g} ms, "
        "the traced step's FLOPs by dtype at the datasheet dense peak "
        f"({flops_mod.describe_blend(blend)}), and memory {memory_ms:.3g} ms, "
        f"{bytes_moved:,} bytes moved ({convention}) at "
        f"{bandwidth.bytes_per_s / 1e12:.3g} TB/s ({bandwidth.source}); a lower bound: "
        "launch overhead, communication and less than full utilisation are not modelled)"))


def _verdict(config: PlanConfig, card: str, peak_at, by_dtype: dict,
             traffic: tuple) -> CardVerdict:
    name, memory, source = card_memory(card)
    line = roofline(card, by_dtype, *traffic)  # as typed: it names a size variant
    step_ms, model = line.step_ms, line.model
    total = peak_at(config.batch_size)
    if memory is None or total is None:
        reason = source if memory is None else "the step's memory is n/a"
        return CardVerdict(name, memory, source, None, None, None, None,
                           f"n/a: {reason}", step_ms, model, reason, line.bound,
                           line.compute_ms, line.memory_ms)
    usable = memory - config.context_bytes
    fits = total <= usable
    best, note = None, "not searched (--max-batch 0)"
    if config.max_batch:
        from engine.run.fit import search

        def fits_at(batch: int) -> bool:
            peak = peak_at(batch)
            return peak is not None and peak <= usable

        best = (search(fits_at, config.max_batch) or 0) if fits else 0
        note = (f"searched over traced steps, batch 1..{config.max_batch}" if fits
                else f"batch {config.batch_size} does not fit, so no smaller search above it")
        if not fits and config.batch_size > 1:
            best = search(fits_at, config.batch_size - 1) or 0
            note = f"searched over traced steps, batch 1..{config.batch_size - 1}"
    return CardVerdict(name, memory, source, usable, fits, usable - total, best, note,
                       step_ms, model, None, line.bound, line.compute_ms, line.memory_ms,
                       _memory_kind(card))


def plan(config: PlanConfig, log=lambda msg: None, on_trial=lambda result: None) -> PlanResult:
    """Trace each recipe, judge it on each card, and answer per card (the recipes asked,
    then the levers engine.run.plan_answer tries when none fits). ``log`` is called before
    each trace (a caller may raise there to stop between traces); ``on_trial`` with the
    result so far after each recipe asked is judged."""
    from engine.models.model_health import check_model
    from engine.run.plan_answer import answer
    from engine.run.plan_memo import TraceMemo

    check_model(config.model, config.seq_len)  # an unknown model: its reason, first
    memo = TraceMemo()  # a lever planned for several cards is traced once
    result = _plan(config, log, on_trial, memo)
    levers: list = []
    answers = answer(config, result,
                     lambda c, lg: _plan(dataclasses.replace(c, levers=False), lg, memo=memo),
                     log, planned_out=levers)
    return dataclasses.replace(result, answers=answers, lever_trials=levers)


def _plan(config: PlanConfig, log, on_trial=lambda result: None, memo=None) -> PlanResult:
    from engine.core.recipes import recipe
    from engine.run.plan_memo import TraceMemo

    memo = memo or TraceMemo()

    reports = [(path, read_report(path)) for path in config.measured]  # bad files: say first
    trials = []
    for precision in config.precisions:
        reason = None  # why the step was not traced
        peaks: dict[int, int | None] = {}
        by_dtype: dict = {}
        bytes_moved = fused = None
        # float8 runs compiled on a card (it is fast only compiled), others with --compile
        compiled = config.compile or recipe(base_precision(precision)).fp8
        memory, method, trace_s, policy = None, "traced", None, None
        buckets = 0  # DDP's gradient buckets, held beside the traced step
        timeline = scaling = None
        if reason is None:
            start = time.perf_counter()
            try:
                (measured, by_dtype, bytes_moved, fused), scaling = memo.trace(
                    config, precision, config.batch_size, log)
            except Exception as exc:  # a custom op without a fake kernel
                reason = f"fake tensors could not trace it: {type(exc).__name__}: {exc}"
            else:
                from engine.measure.kernel_workspace import PLAN_NOTE as WORKSPACE_NOTE
                from engine.measure.memory_breakdown import breakdown_fields
                from engine.run.plan_quant import quant_note

                trace_s = time.perf_counter() - start
                policy = _step_policy(config, precision)
                memory = MemoryBreakdown(
                    **breakdown_fields(measured, TRACE_METHOD),
                    notes=f"traced on the CPU device; autocast: {policy or 'none'}; "
                          f"{_attention_note(config)}{quant_note(precision, config.trace_as)}"
                          f"{WORKSPACE_NOTE + '; ' if config.trace_as == 'cpu' else ''}"
                          "CUDA's allocator rounding and kernels' "
                          "scratch are not in this figure")
                if base_precision(precision) in FSDP2_ONLY:
                    memory = dataclasses.replace(memory, notes=f"{memory.notes}; {_PRECOMPUTE}")
                if config.strategy == "ddp":
                    buckets = measured.at_phase_start["optimizer"]["grads"]
                    memory = _with_ddp_buckets(memory, buckets, config.nproc_per_node)
                peaks[config.batch_size] = memory.total_bytes
                timeline = traced_timeline(measured, buckets)
        if memory is None and config.strategy != "none":
            method = "n/a"
            reason += "; the memory model predicts one process only"
        elif memory is None:
            try:
                memory, method = _fallback(config, precision, config.batch_size), "memory model"
            except Exception as exc:  # a model the memory model has no shape for
                method = "n/a"
                reason += f"; the memory model cannot predict it either ({exc})"
            else:
                reason += ("; the calibrated memory model (engine.models.memory_model) predicts it "
                           "instead, from the model's shape built on the meta device")
        if memory is not None:
            peaks.setdefault(config.batch_size, memory.total_bytes)

        def peak_at(batch: int, precision=precision, method=method, peaks=peaks,
                    buckets=buckets):
            if batch not in peaks:
                log(f"{precision}: probing micro-batch {batch}")
                if method == "traced":
                    peaks[batch] = memo.trace(config, precision, batch, log,
                                              timeline=False)[0].memory.peak_bytes + buckets
                elif method == "memory model":
                    peaks[batch] = _fallback(config, precision, batch).total_bytes
                else:
                    peaks[batch] = None
            return peaks[batch]

        traffic = ((fused, FUSED_CONVENTION) if compiled
                   else (bytes_moved, TRAFFIC_CONVENTION))
        cards = [_verdict(config, card, peak_at, by_dtype, traffic) for card in config.cards]
        trials.append(PlanTrial(precision, method, reason, memory, by_dtype, trace_s, cards,
                                trial_optimizer(config, precision),
                                _measured(config, precision, reports), bytes_moved, fused,
                                compiled, memory_timeline=timeline, autocast_policy=policy,
                                scaling=scaling))
        on_trial(_result(config, list(trials)))
    return _result(config, trials)


def _result(config: PlanConfig, trials: list) -> PlanResult:
    return PlanResult(config.model, config.batch_size, config.seq_len,
                      config.grad_checkpointing, config.optimizer, config.context_bytes, trials,
                      grad_accum=config.grad_accum, strategy=config.strategy,
                      nproc_per_node=config.nproc_per_node)


def _attention_note(config: PlanConfig) -> str:
    from engine.run.plan_autocast import ATTENTION

    return f"attention: {ATTENTION}; " if config.trace_as == "card" else ""


def _step_policy(config: PlanConfig, precision: str) -> str | None:
    """traced_policy of the step the trace runs: FSDP2 casts by its policy, not autocast."""
    from engine.core.recipes import recipe

    rec = recipe(split_label(precision)[0])
    return None if config.strategy == "fsdp2" else traced_policy(config, rec)


def _measured(config: PlanConfig, precision: str, reports: list) -> MeasuredTrial | None:
    """A real trial of what this precision's plan traces, from --measured or the history."""
    from functools import cache

    @cache
    def param_count() -> int:  # the model a trial of this label loads, built on meta
        return meta_shape(config, precision).total_params

    return find_measured(config, precision, param_count, reports)


_PRECOMPUTE = (
    "torchao's per-step float8 scale precompute (precompute_float8_dynamic_scale_for_fsdp, "
    "which a rank runs after each optimizer step) is not traced: torchao 0.18's "
    "WeightWithDynamicFloat8CastTensor.__tensor_flatten__ tests the precomputed scale's "
    "truth value, which a fake tensor does not have; each all-gather computes its weight's "
    "scale instead, which differs by a few scalars, not in the float8 bytes gathered")

def _with_ddp_buckets(memory: MemoryBreakdown, buckets: int, world: int) -> MemoryBreakdown:
    """One DDP rank: the single-process step plus the gradient buckets DDP allocates when
    it wraps the model (a copy of every gradient, in its dtype). DDP cannot run on the fake
    process group (its reducer reads the all-reduce's result), so this part is computed,
    not traced."""
    return dataclasses.replace(
        memory, total_bytes=memory.total_bytes + buckets,
        total_method=(f"{memory.total_method}; plus DDP's gradient buckets ({buckets:,} B, "
                      "one copy of every gradient), computed, not traced: DDP's reducer "
                      "reads the all-reduce's result, which the fake process group has none "
                      "of"),
        notes=(f"{memory.notes}; DDP rank of {world}: every rank holds the whole model, "
               "gradients and optimizer state, so the figure does not depend on the world "
               "size"))
