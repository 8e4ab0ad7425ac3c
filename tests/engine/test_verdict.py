"""The verdict's rules against hand-built run records (real event dataclasses).

Each expected figure is recomputed here from the step times and peaks the record was
built with, not read back from engine.record.compare.
"""

from __future__ import annotations

import dataclasses

import pytest

from engine.core.events import HostLoad
from engine.record.compare import format_bytes
from engine.record.verdict import figure_text, verdict
from tests.engine.verdict_records import STEPS, GiB, median_ms, record, trial


def test_clear_winner_cites_its_measured_speed_memory_and_loss():
    fp32 = trial("fp32", 100.0, 8 * GiB, 3.000)
    bf16 = trial("bf16-amp", 52.0, 5 * GiB, 3.002)
    fp16 = trial("fp16-amp", 52.0, 5 * GiB, 3.001, skipped=2)
    v = verdict(record(fp32, bf16, fp16))
    assert v.precision == "bf16-amp"
    speedup = median_ms(fp32) / median_ms(bf16)
    assert v.headline.startswith(f"Train in bf16-amp: {speedup:.2f}x fp32's speed [")
    figure = next(f for f in v.figures if f.precision == "bf16-amp")
    assert figure.judgement == "recommended"
    assert figure.speedup_ci[0] < speedup < figure.speedup_ci[1]
    assert f"[{figure.speedup_ci[0]:.2f}-{figure.speedup_ci[1]:.2f}]" in v.headline
    assert figure_text(figure) == (f"{speedup:.2f}x [{figure.speedup_ci[0]:.2f}-"
                                   f"{figure.speedup_ci[1]:.2f}], saves 3.00 GiB (38%), "
                                   f"loss {3.002 - 3.000:+.3g}")
    assert f"saves {format_bytes(3 * GiB)} ({3 / 8:.0%})" in v.headline
    assert f"loss {3.002 - 3.000:+.3g} vs fp32 after {STEPS} steps" in v.headline
    assert v.headline.endswith("fp16-amp is as fast but skipped 2 steps")


def test_unrankable_speed_still_answers_on_memory_and_says_why():
    # three measured steps each: no CI, so no speed ranking; memory and loss still judge
    v = verdict(record(trial("fp32", 100.0, 8 * GiB, 3.0, steps=4),
                       trial("bf16-amp", 50.0, 5 * GiB, 3.0, steps=4)))
    assert v.precision == "bf16-amp"
    assert v.headline.startswith(f"Train in bf16-amp: saves {format_bytes(3 * GiB)} (38%), ")
    assert ("speed not ranked: too few measured steps for a spread (need 5): fp32 3, "
            "bf16-amp 3; run more steps (--steps 20)") in v.headline
    assert "--steps 20" in v.advice
    bf16 = {f.precision: f for f in v.figures}["bf16-amp"]
    assert (bf16.judgement, bf16.note) == ("recommended", "uses less memory (speed not ranked)")
    # steps spread 40% within their round widen the CI, which still excludes 1 at 2x
    v = verdict(record(trial("fp32", 100.0, 8 * GiB, 3.0, cv=0.4),
                       trial("bf16-amp", 50.0, 5 * GiB, 3.0, cv=0.4)))
    assert v.precision == "bf16-amp"
    assert v.headline.startswith("Train in bf16-amp: 2.12x fp32's speed [1.47-2.93]")
    assert "idle machine" in v.advice


def test_single_precision_has_nothing_to_compare():
    v = verdict(record(trial("fp32", 100.0, 8 * GiB, 3.0)))
    assert v.precision == "fp32"
    assert v.headline == ("Train in fp32: the only precision in this run, so nothing was "
                          "compared with it")
    assert v.advice == "profile fp32 with bf16-amp and fp16-amp (the default precisions)"
    assert [figure_text(f) for f in v.figures] == ["speed-up n/a, memory n/a, loss n/a"]


def test_all_failed_says_so_with_each_status():
    v = verdict(record(trial("fp32", 0, 0, 0, status="oom"),
                        trial("bf16-amp", 0, 0, 0, status="error")))
    assert v.precision is None
    assert "no trial finished (fp32: oom; bf16-amp: error)" in v.headline
    assert "smaller batch" in v.advice


def test_without_fp32_the_highest_precision_that_finished_is_the_reference():
    v = verdict(record(trial("bf16-amp", 50.0, 5 * GiB, 3.0),
                        trial("fp16-amp", 50.0, 5 * GiB, 3.0)))
    assert v.precision == "fp16-amp" and v.reference == "fp16-amp"
    assert v.headline.startswith("Train in fp16-amp: no other precision was")
    assert v.headline.endswith("Compared against fp16-amp, the highest-precision recipe that "
                               "finished (no fp32 trial in this run: add fp32 to the "
                               "precisions to compare against it)")
    assert "profile again with fp32" in v.advice


@pytest.mark.parametrize(("fp16_loss", "judged_as"),
                         [(float("nan"), "diverged"), (3.0 + 0.5, "learned less")])
def test_diverged_fp16_is_never_recommended_however_fast(fp16_loss, judged_as):
    fp32 = trial("fp32", 100.0, 8 * GiB, 3.0)
    bf16 = trial("bf16-amp", 60.0, 6 * GiB, 3.01)
    fp16 = trial("fp16", 30.0, 4 * GiB, fp16_loss)  # faster and smaller, but diverged
    v = verdict(record(fp32, bf16, fp16))
    assert v.precision == "bf16-amp"
    judged = {f.precision: f.judgement for f in v.figures}
    assert judged == {"fp32": "baseline", "bf16-amp": "recommended", "fp16": judged_as}
    # pure fp16 weights with no lost-update measurement are named in the headline too
    assert "Not recommended: fp16 (pure fp16 weights, no fp32 master copy" in v.headline


def test_nothing_better_recommends_fp32_and_says_why_not_the_others():
    fp32 = trial("fp32", 100.0, 8 * GiB, 3.0)
    same = trial("bf16-amp", 100.0, 8 * GiB, 3.0, seed=1)  # tied speed, same memory
    v = verdict(record(fp32, same))
    assert v.precision == "fp32"
    assert v.headline.startswith("Train in fp32: no other precision was significantly faster")
    assert "bf16-amp not better" in v.headline


def test_slower_precision_is_not_recommended_for_its_memory():
    fp32 = trial("fp32", 100.0, 8 * GiB, 3.0)
    slow = trial("fp16-amp", 300.0, 6 * GiB, 3.0)  # 25% less memory, 3x slower
    v = verdict(record(fp32, slow))
    assert v.precision == "fp32"
    assert {f.precision: f.judgement for f in v.figures}["fp16-amp"] == "slower"


def test_tie_in_speed_is_broken_by_memory():
    fp32 = trial("fp32", 100.0, 8 * GiB, 3.0)
    big = trial("fp16-amp", 50.0, 6 * GiB, 3.0)
    small = trial("bf16-amp", 50.0, 4 * GiB, 3.0, seed=2)
    v = verdict(record(fp32, big, small))
    assert v.precision == "bf16-amp"
    assert v.headline.endswith(f"fp16-amp is as fast but uses {format_bytes(2 * GiB)} more")


def test_emulated_bf16_is_not_recommended_on_speed():
    fp32 = trial("fp32", 100.0, 8 * GiB, 3.0)
    bf16 = trial("bf16-amp", 50.0, 8 * GiB, 3.0)  # "faster", no memory saved
    assert verdict(record(fp32, bf16)).precision == "bf16-amp"  # with bf16 hardware
    v = verdict(record(fp32, bf16, bf16_hardware=False))
    assert v.precision == "fp32"
    assert any("bf16 is emulated" in r for r in v.reasons)


def test_emulated_formats_are_never_called_as_fast_as_each_other():
    fp32 = trial("fp32", 100.0, 8 * GiB, 3.0)
    fp8 = dataclasses.replace(trial("fp8", 60.0, 6 * GiB, 3.0001), support="emulated")
    rowwise = dataclasses.replace(trial("fp8-rowwise", 60.0, 6 * GiB, 3.0005, seed=4),
                                  support="emulated")
    v = verdict(record(fp32, fp8, rowwise))
    assert v.precision == "fp8"
    assert "as fast" not in v.headline
    # 0.0004 apart in loss is within the spread: a tie, decided by the stated rule
    assert v.headline.endswith("fp8-rowwise (speed not judged): where it is alike, tied on "
                               "every criterion: the one listed first is named")
    bigger = dataclasses.replace(trial("fp8-rowwise", 60.0, 7 * GiB, 3.0, seed=4),
                                 support="emulated")
    v = verdict(record(fp32, fp8, bigger))
    assert v.headline.endswith(f"fp8-rowwise (speed not judged) uses {format_bytes(GiB)} more")


def test_lora_recipes_are_listed_apart():
    fp32 = trial("fp32", 100.0, 8 * GiB, 3.0)
    nf4 = trial("nf4", 50.0, 2 * GiB, 3.0, lora={"r": 8})
    v = verdict(record(fp32, nf4))
    assert v.precision == "fp32"
    assert {f.precision: f.judgement for f in v.figures}["nf4"] == "LoRA only"


def test_numerics_lab_breaks_a_tie_in_speed_and_memory():
    fp32 = trial("fp32", 100.0, 8 * GiB, 3.0)
    fp16 = trial("fp16-amp", 50.0, 5 * GiB, 3.0)
    bf16 = trial("bf16-amp", 50.0, 5 * GiB, 3.0, seed=3)
    rec = record(fp32, fp16, bf16)
    rec.numerics = {"advice": {"recommended": "fp16-amp"}}
    v = verdict(rec)
    assert v.precision == "fp16-amp"
    assert "the numerics lab recommends fp16-amp" in v.reasons


def test_busy_host_refuses_to_rank_even_a_steady_slowdown():
    # the run: fp32 steady (CV 1%) but slowed by another program during its trial
    idle = HostLoad(cpu_count=2, samples=50, load_avg_1m_mean=1.1, load_avg_1m_max=1.3,
                    other_cpu_pct_mean=3.0, other_cpu_pct_max=6.0)
    busy = HostLoad(cpu_count=2, samples=50, load_avg_1m_mean=1.9, load_avg_1m_max=2.0,
                    other_cpu_pct_mean=24.0, other_cpu_pct_max=30.0)
    v = verdict(record(trial("fp32", 110.0, 8 * GiB, 3.0, host_load=busy),
                        trial("bf16-amp", 100.0, 8 * GiB, 3.0, host_load=idle)))
    # the same memory and loss: the answer is fp32, and the speed is named as not judged
    assert v.precision == "fp32"
    assert v.headline.startswith("Train in fp32: no other precision was 5% smaller")
    assert "; speed not ranked: the machine was busy (" in v.headline
    assert "3% of the CPU during bf16-amp and 24% during fp32" in v.headline
    assert "close other programs" in v.advice


def test_gated_and_failed_precisions_are_named_and_their_reasons_kept():
    from engine.core.events import TrialResult

    fp32 = trial("fp32", 100.0, 8 * GiB, 3.0)
    oom = trial("fp16", 0, 0, 0, status="oom")
    fp8 = TrialResult("fp8", "unsupported", "fp8 training needs compute capability 8.9+")
    v = verdict(record(fp32, oom, fp8))
    assert v.precision == "fp32"
    assert v.headline.endswith("fp16 oom, fp8 unsupported")
    assert "fp8 did not run: fp8 training needs compute capability 8.9+" in v.reasons
    why = {f.precision: f.note for f in v.figures}
    assert why["fp16"] == "fp16 failed in the test"  # the trial's own reason, under "Why"


def _lost(norm_share_at_min: float, rounding: str = "nearest", kept: float = 0.5):
    from engine.core.events import LostUpdates

    return LostUpdates("test", "bfloat16", rounding, 1e-4, 1e-5, 0.1, 0.1, 0.9,
                       norm_share_at_min, norm_share_at_min, kept)


def _held(before: float, after: float, steps: int = 12):
    from engine.core.events import HeldOutLoss

    return HeldOutLoss("test", 2, 2048, before, after, steps)


def test_a_recipe_that_loses_its_updates_is_not_recommended_however_fast():
    fp32 = trial("fp32", 100.0, 8 * GiB, 3.0)
    amp = trial("bf16-amp", 60.0, 6 * GiB, 3.0, seed=1)
    bf16 = dataclasses.replace(trial("bf16", 40.0, 4 * GiB, 3.0, seed=2),
                               lost_updates=_lost(0.7))
    v = verdict(record(fp32, amp, bf16))
    assert v.precision == "bf16-amp"
    assert v.headline.endswith(
        "Not recommended: bf16 would lose 70% of its updates at lr 1e-05: train in bf16-amp, "
        "or bf16+adamw-bf16-sr (stochastic rounding)")
    assert {f.precision: f.judgement for f in v.figures}["bf16"] == "loses updates"
    # under the stated share it qualifies; stochastic rounding is judged by the kept share
    few = dataclasses.replace(bf16, lost_updates=_lost(0.04))
    assert verdict(record(fp32, amp, few)).precision == "bf16"
    sr = dataclasses.replace(bf16, precision="bf16+adamw-bf16-sr",
                             lost_updates=_lost(0.8, "stochastic", kept=0.99))
    assert verdict(record(fp32, amp, sr)).precision == "bf16+adamw-bf16-sr"


def test_the_loss_is_judged_against_fp32s_own_held_out_drop():
    fp32 = dataclasses.replace(trial("fp32", 100.0, 8 * GiB, 3.0),
                               heldout_loss=_held(4.0, 3.5))  # fp32's drop: 0.5
    near = dataclasses.replace(trial("bf16-amp", 50.0, 5 * GiB, 3.0, seed=1),
                               heldout_loss=_held(4.0, 3.5 + 0.04))  # within 10% of 0.5
    far = dataclasses.replace(trial("fp16-amp", 50.0, 5 * GiB, 3.0, seed=2),
                              heldout_loss=_held(4.0, 3.5 + 0.06))  # learned 12% less
    v = verdict(record(fp32, near, far))
    judged = {f.precision: f.judgement for f in v.figures}
    assert judged == {"fp32": "baseline", "bf16-amp": "recommended",
                      "fp16-amp": "learned less"}
    assert any("fp32's loss fell 0.5 in 12 steps" in r for r in v.reasons)
    # a held-out loss that overflowed is beyond any tolerance
    nan = dataclasses.replace(near, heldout_loss=_held(4.0, float("nan")))
    assert {f.precision: f.judgement for f in verdict(record(fp32, nan)).figures}[
        "bf16-amp"] == "learned less"
    # fp32 barely learned: the loss cannot be judged, and the headline says so
    flat = dataclasses.replace(fp32, heldout_loss=_held(4.0, 3.99))
    v = verdict(record(flat, near, far))
    assert "cannot judge the loss after 12 steps: fp32's held-out loss fell only 0.01" \
        in v.headline
    assert "learned less" not in {f.judgement for f in v.figures}


def test_compiled_fp8_is_not_ranked_against_eager_trials():
    from engine.core.recipes import recipe, run_description

    def ran(t, compiled):
        return dataclasses.replace(t, recipe=run_description(recipe(t.precision), "cuda",
                                                             "adamw", compiled))

    fp32 = ran(trial("fp32", 100.0, 8 * GiB, 3.0), False)
    amp = ran(trial("bf16-amp", 58.0, 6 * GiB, 3.0, seed=1), False)
    fp8 = ran(trial("fp8", 31.4, 6 * GiB, 3.0, seed=2), True)  # compiled: 1.85x bf16-amp
    v = verdict(record(fp32, amp, fp8))
    assert v.precision == "bf16-amp"
    speed = next(r for r in v.reasons if r.startswith("speed: "))
    assert "fp8 ran compiled while fp32 ran eager: not like with like, so its speed is " \
           "left out of the ranking" in speed
    assert "fp8" not in speed.split(";")[0]  # the ranking itself
    figure = {f.precision: f for f in v.figures}["fp8"]
    # compiled memory beside eager memory measures torch.compile: neither is compared
    assert figure.judgement == "not compared"
    assert figure.note.startswith("ran compiled while fp32 ran eager: its speed and memory "
                                  "are compared only with compiled trials")
    assert figure.memory_saved_bytes is None and figure.speedup_vs_fp32 is None
    assert "Not compared: fp8 (ran compiled while fp32 ran eager" in v.headline
    # all compiled (--compile): ranked together
    same = verdict(record(ran(fp32, True), ran(amp, True), fp8))
    assert same.precision == "fp8"


def test_the_trials_compiled_flag_decides_like_with_like():
    fp32 = dataclasses.replace(trial("fp32", 100.0, 8 * GiB, 3.0), compiled=False)
    amp = dataclasses.replace(trial("bf16-amp", 24.0, 6 * GiB, 3.0, seed=1), compiled=True)
    v = verdict(record(fp32, amp))
    speed = next(r for r in v.reasons if r.startswith("speed: "))
    assert "bf16-amp ran compiled while fp32 ran eager: not like with like" in speed
    figure = {f.precision: f for f in v.figures}["bf16-amp"]
    assert v.precision == "fp32" and figure.judgement == "not compared"
    assert "Not compared: bf16-amp (ran compiled while fp32 ran eager" in v.headline
