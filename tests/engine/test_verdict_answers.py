"""Every run answers (issue #44): fed with the real H200 reports (tests/data/h200-2026-11-27)
and with CPU-style records whose speeds cannot be ranked."""

from __future__ import annotations

import dataclasses

from engine.core.events import HeldOutLoss, HostLoad
from engine.record.summary import summarise
from engine.record.verdict import verdict
from engine.run.timed_memory import timed_peak
from tests.engine import h200
from tests.engine.verdict_records import GiB, record, trial


def _compiled_fp8():
    """The H200's fp8 trial as this AmpScope reports it: compiled, its peak the compiled
    steps' (6.10 GB; its eager memory step held 12.90 GB)."""
    fp8 = h200.report("02-gpt2-fp8.json").trials[0]
    memory, reason = timed_peak(fp8.memory, True)
    summary = summarise(fp8.steps, tokens_per_step=8 * 1024,
                        model_flops_per_step=fp8.flops.analytic_per_step,
                        counted_flops_per_step=fp8.flops.counted_per_step, peak=None,
                        memory=memory, memory_reason=reason)
    assert summary.peak_memory_bytes / 1e9 < 6.2
    return dataclasses.replace(fp8, summary=summary, compiled=True)


def test_compiled_fp8_does_not_take_credit_for_torch_compiles_memory_h200():
    sweep = h200.report(h200.SWEEP)
    v = verdict(dataclasses.replace(sweep, trials=[*sweep.trials, _compiled_fp8()]))
    assert v.precision == "bf16-amp"  # an eager recipe, judged against eager fp32
    fp8 = {f.precision: f for f in v.figures}["fp8"]
    assert fp8.judgement == "not compared" and fp8.memory_saved_bytes is None
    assert "Not compared: fp8 (ran compiled while fp32 ran eager: its speed and memory are " \
           "compared only with compiled trials" in v.headline
    assert "saves 8.24 GiB" not in v.headline


def test_bf16_amp_and_fp16_amp_tie_and_the_stated_rule_decides_h200():
    v = verdict(h200.report(h200.SWEEP))
    # 2.94x vs 2.95x fp32 (tied CIs), the same memory, losses 0.0011 apart (within the spread)
    assert v.precision == "bf16-amp"
    assert v.headline.startswith("Train in bf16-amp: 2.94x fp32's speed [")
    assert ("fp16-amp is as fast but its loss is within the spread: ties go to bf16 over fp16 "
            "where bf16 runs natively (no loss scaling to tune)") in v.headline
    assert "further from fp32" not in v.headline
    assert any("fp32's spread is 0.0796" in r for r in v.reasons)


def test_without_fp32_the_highest_precision_recipe_is_the_reference_h200():
    v = verdict(h200.report("03-gpt2-int8_nf4.json"))
    assert v.reference == "int8" and v.precision == "nf4"
    # 1.79 GB vs 2.05 GB, both LoRA over a frozen base: compared with each other
    assert v.headline.startswith("Train in nf4: saves 248.87 MiB (13%), loss -0.0497 vs int8")
    assert "Compared against int8, the highest-precision recipe that finished (no fp32 " \
           "trial in this run" in v.headline
    assert "speed not ranked: too few measured steps" in v.headline
    assert {f.precision: f.judgement for f in v.figures} == {"int8": "baseline",
                                                             "nf4": "recommended"}


BUSY = HostLoad(cpu_count=2, samples=50, load_avg_1m_mean=1.9, load_avg_1m_max=2.0,
                other_cpu_pct_mean=40.0, other_cpu_pct_max=55.0)


def test_a_busy_cpu_run_still_answers_on_memory_and_says_speed_was_not_ranked():
    v = verdict(record(trial("fp32", 110.0, 8 * GiB, 3.0, host_load=BUSY),
                       trial("bf16-amp", 100.0, 5 * GiB, 3.0, host_load=BUSY),
                       bf16_hardware=False))
    assert v.headline.startswith("Train in bf16-amp: saves 3.00 GiB (38%), loss +0 vs fp32")
    assert "; speed not ranked: the machine was busy (" in v.headline
    assert "close other programs" in v.headline and "close other programs" in v.advice


def _drifting(t, drift):
    """``t`` with its measured steps split into two interleaved rounds, the second slower."""
    measured = [s for s in t.steps if not s.warmup]
    half = len(measured) // 2
    late = {id(s) for s in measured[half:]}
    steps = [dataclasses.replace(s, round=1, step_ms=s.step_ms * (1 + drift))
             if id(s) in late else s for s in t.steps]
    return dataclasses.replace(t, steps=steps)


def test_drift_widens_the_ratio_instead_of_silencing_the_verdict():
    # the CPU sweeps: fp32 15x faster than emulated half recipes, 24% drift in every recipe
    fp32 = _drifting(trial("fp32", 10.0, 8 * GiB, 3.0), 0.24)
    fp16 = _drifting(trial("fp16-amp", 150.0, 6 * GiB, 3.0, seed=1), 0.24)
    v = verdict(record(fp32, fp16))
    assert v.precision == "fp32"
    assert {f.precision: f.judgement for f in v.figures}["fp16-amp"] == "slower"
    assert "rounds differ by 24% in median step time" in v.reasons[0]
    # two recipes 5% apart with 20% drift: a tie, so memory decides
    fp32 = _drifting(trial("fp32", 100.0, 8 * GiB, 3.0), 0.20)
    amp = _drifting(trial("bf16-amp", 95.0, 6 * GiB, 3.0, seed=1), 0.20)
    v = verdict(record(fp32, amp))
    assert v.headline.startswith("Train in bf16-amp: ")
    assert "(not significantly faster)" in v.headline
    assert v.reasons[0].startswith("speed: speed-ups not significant")


def _held(before, after):
    return HeldOutLoss("test", 2, 2048, before, after, 20)


def test_pure_fp16_that_learned_less_is_ruled_out_and_named():
    fp32 = dataclasses.replace(trial("fp32", 100.0, 8 * GiB, 7.00), heldout_loss=_held(10.95, 7.21))
    amp = dataclasses.replace(trial("bf16-amp", 60.0, 6 * GiB, 7.01, seed=1),
                              heldout_loss=_held(10.95, 7.20))
    fp16 = dataclasses.replace(trial("fp16", 40.0, 4 * GiB, 7.84, seed=2),
                               heldout_loss=_held(10.95, 10.93))
    v = verdict(record(fp32, amp, fp16))
    assert v.precision == "bf16-amp"
    figure = {f.precision: f for f in v.figures}["fp16"]
    assert figure.judgement == "learned less"
    assert figure.note.startswith("learned less than fp32: held-out loss 10.93 vs 7.21")
    # a held-out loss that rose over the run is named as diverged
    rose = dataclasses.replace(fp16, heldout_loss=_held(10.95, 11.40))
    figure = {f.precision: f for f in verdict(record(fp32, amp, rose)).figures}["fp16"]
    assert figure.judgement == "diverged"
    assert figure.note.startswith("diverged: held-out loss rose from 10.95; held-out loss 11.4 "
                                  "vs 7.21")
