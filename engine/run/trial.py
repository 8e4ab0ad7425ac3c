"""One trial: load the model at one precision, count, train for timed steps, summarise.

``run_trial`` and the order of a trial's parts live here; the parts have modules of their
own: the set-up (``trial_setup``: model, optimiser, scaler, batches), the timed steps
(``trial_steps``), FLOPs and peaks (``trial_flops``), the untimed measurements
(``trial_untimed``: SQNR, memory step, profiled step, held-out loss, lost updates), and
what was measured so far (``trial_state``).

What was measured before a failure (OOM, an exception, a cancel) is kept: the trial
state accumulates as it goes, and the result is built from it whatever the ending.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import torch

from engine.core.config import AUTO, TORCHAO_STEP, RunConfig, base_precision
from engine.core.events import FlopsInfo, LogEvent, StepSample, TrialResult
from engine.core.recipes import compiles, fp32_precision, library_sync_notes, recipe
from engine.measure import matmul_peak, nvml, peak_choice
from engine.measure.device import DeviceInfo
from engine.measure.gpm import GpmWindow
from engine.measure.trackers import AllocatorTracker
from engine.measure.untouched import untouched
from engine.models import heldout as held_out
from engine.models.optimizers import optimizer_reason
from engine.record.bounded import traceback_text
from engine.run import fp8_auto, trial_flops, trial_setup, trial_steps, trial_untimed
from engine.run.trial_state import TrialState, failure

# why a round before an interleaved precision's last has no held-out loss or lost updates:
# only seen where the run was stopped between its rounds
LATER_ROUND = ("not measured: the precision's last round measures it, and the run was stopped "
               "before that round")


def run_trial(
    config: RunConfig,
    precision: str,
    device_info: DeviceInfo,
    emit: Callable[[object], None],
    cancelled: Callable[[], bool],
    prior_steps: tuple[StepSample, ...] = (),
    round_index: int = 0,
    prior_flops: FlopsInfo | None = None,
) -> TrialResult:
    """Measure one precision. Never raises: failures become the trial's status.

    ``prior_steps`` are the steps of this precision's earlier rounds when precisions are
    interleaved (engine/run/rounds.py): they open the result's steps, new steps are numbered
    after them, and the summary covers them all. ``prior_flops``: the FLOPs the first round
    counted, which a later round takes instead of counting them again (its uncounted step
    would cost as much as a measured one).
    """
    rec = recipe(precision)
    state = TrialState(config, rec, device_info, steps=list(prior_steps),
                       round_index=round_index, step_offset=len(prior_steps), flops=prior_flops)
    reason = (device_info.unsupported_reason(base_precision(precision))
              or optimizer_reason(state.optimizer, device_info.kind)
              or trial_setup.shape_reason(config, rec, device_info.verdict(precision))
              or (fp8_auto.card_reason(precision, config.payoff_card, device_info.kind,
                                       device_info.name) if rec.keep_high == AUTO else None))
    if reason:
        return state.result("unsupported", reason)
    # before this trial touches the GPU: the fallback when NVML shows no pid of ours
    state.nvml_baseline_bytes = nvml.used_bytes(device_info.nvml_handle())
    try:
        with device_info.device_context(), fp32_precision(rec):
            stopped = _measure(state, emit, cancelled)
    except Exception as exc:
        return state.result(*failure(exc), traceback_text(exc))
    finally:
        if device_info.kind == "cuda":
            try:  # after a sticky CUDA error this raises too: the result must still go out
                torch.cuda.empty_cache()
            except Exception:  # noqa: S110
                pass
    if stopped:
        measured = sum(1 for s in state.steps if not s.warmup)
        return state.result("cancelled", f"stopped by the user after {measured} measured steps")
    return state.result("ok", None)


def _measure(state: TrialState, emit, cancelled) -> bool:
    """Fill ``state``; returns True when the run was cancelled part-way."""
    config, rec, info = state.config, state.rec, state.device_info
    device = info.torch_device

    def log(msg: str, level: str = "info") -> None:
        emit(LogEvent(level, msg, rec.precision, time.time()))

    if matmul_peak.cached(info) is None:
        log(f"measuring this machine's matmul peak ({', '.join(matmul_peak.DTYPES)}; once per "
            f"machine, cached in {matmul_peak.cache_path()})")
    # before the model: the GPU's memory is free for it, and the seed below is untouched
    rates = matmul_peak.for_device(info)
    # an ':auto' recipe's layers, from a skeleton built before the seed below is set
    auto = (fp8_auto.choose(config, rec.precision, info.name, info.kind)
            if rec.keep_high == AUTO else None)
    torch.manual_seed(config.seed)

    loaded = trial_setup.load(state, log, auto)
    model = loaded.model
    if cancelled():
        return True
    params, optimizer, scaler, batches = trial_setup.train_with(state, loaded, log)

    verdict = info.verdict(rec.precision)
    state.compiled = compiles(rec, config.compile, config.warmup, verdict)
    if verdict is not None and verdict.support == "emulated":
        state.notes.append(f"emulated: {verdict.reason}")
    state.phase(emit, "probes")
    count_first = None  # how the first warm-up step runs: counted when no probe counted
    # a step that compiles (the model, or torchao's optimizer step) is counted apart, eagerly:
    # dynamo does not trace under FlopCounterMode
    if state.flops is None and (state.compiled or state.optimizer in TORCHAO_STEP):
        trial_flops.probe(state, loaded, batches[0])
    elif state.flops is None:
        count_first = functools.partial(trial_flops.counted_step, state, loaded, rates,
                                        optimizer=optimizer, scaler=scaler)
    trial_untimed.measure_quant_error(state, model, batches[0], device)
    held = None
    if config.last_round:  # the held-out loss an earlier round measured would be replaced
        held = held_out.batches(loaded, config, device)
        with untouched(model, device):
            state.heldout_before = held_out.loss(model, rec, held, device)
    if state.flops is not None:
        trial_flops.set_peaks(state, rates)
    state.common_peak = peak_choice.common_peak(info)
    state.notes.extend(library_sync_notes(rec, loaded.task, state.compiled, state.optimizer,
                                          device.type))
    if state.compiled:
        # as a fresh process would: an inline trial (fit's probes) must not reuse the graphs,
        # guards and dynamic-shape decisions of the trial before it, nor count toward its
        # recompile limit (past it dynamo runs the model eagerly without a word)
        torch._dynamo.reset()
        compiles_before = trial_steps.compile_counts()
    step_model = torch.compile(model) if state.compiled else model
    alloc = AllocatorTracker(device)
    gpm = GpmWindow(info)
    stopped = trial_steps.train_steps(state, step_model, params, optimizer, scaler, batches,
                                      alloc, emit, cancelled, gpm, count_first)
    state.gpm = gpm.stop()
    if matmul_peak.beaten_by(state.steps[state.step_offset:]):
        with untouched(model, device):  # its random matrices draw from the RNG
            trial_flops.remeasure_peak(state, log)
    if state.compiled:
        note, breaks = trial_steps.compile_note(compiles_before, trial_steps.compile_counts())
        state.notes.append(note)
        if breaks:
            log(note, "warning")
    if stopped or not config.last_round:
        # a cancel ends the trial now: no further untimed step to watch memory; a round before
        # the last keeps what it holds, as a run stopped before its last round would show
        state.memory = trial_untimed.memory_at_rest(model, optimizer, batches[0], device)
        state.memory_at_rest = True
        if stopped:
            return True
        state.heldout_reason = state.lost_updates_reason = LATER_ROUND
        trial_untimed.profiled_tail(state, step_model, params, optimizer, scaler, batches, log,
                                    cancelled, emit)
        return False
    trial_untimed.memory_step(state, model, loaded, optimizer, scaler, batches, alloc, emit,
                              log)
    trial_untimed.profiled_tail(state, step_model, params, optimizer, scaler, batches, log,
                                cancelled, emit)
    if not cancelled():
        trial_untimed.untimed_tail(state, model, params, optimizer, scaler, batches[0], held)
    return False
