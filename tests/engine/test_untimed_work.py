"""The untimed work around the measured steps runs once per recipe and the optional parts
can be turned off: the SQNR forward and the profiled step (CLI flags; the window's form in
tests/gui/test_untimed_toggles.py)."""

import json
import sys
from pathlib import Path

from engine.core.config import RunConfig
from engine.core.events import PhaseChanged
from engine.run.runner import Runner
from tests.cli_in_process import run_cli

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(model="tiny", batch_size=1, seq_len=16, device="cpu")


def test_the_cli_turns_off_the_sqnr_forward_and_the_profiled_step(tmp_path, monkeypatch):
    # the command line in this process; its trial still runs in a child process (spawned
    # ``profile``: test_cli_spread)
    out = tmp_path / "r.json"
    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path / "data"))
    done = run_cli("profile", "--model", "tiny", "--precision", "bf16-amp", "--batch-size", "1",
                   "--seq-len", "16", "--steps", "2", "--warmup", "1", "--device", "cpu",
                   "--quiet", "--no-quant-error", "--no-kernel-profile", "--out", str(out))
    assert done.returncode == 0, done.stderr
    (trial,) = json.loads(out.read_text())["trials"]
    assert trial["status"] == "ok"
    assert trial["quant_error"] is None
    assert trial["quant_error_reason"] == "turned off (--no-quant-error)"
    assert trial["profiled_step"] is None and "--no-kernel-profile" in trial[
        "profiled_step_reason"]
    assert "profiled step" not in trial["phase_times"]
    assert trial["phase_times"]["probes"] >= 0  # the FLOP count still runs: MFU needs it


def test_interleaved_rounds_measure_sqnr_and_profile_once_per_recipe(tmp_path, monkeypatch):
    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path))
    events: list = []
    config = RunConfig(**TINY, precisions=("fp32", "bf16-amp"), steps=4, warmup=1,
                       interleave="on", rounds=2, isolation="inline")
    record = Runner(config, events.append).run()
    profiled = [(e.precision, e.round) for e in events
                if isinstance(e, PhaseChanged) and e.phase == "profiled step"]
    assert sorted(profiled) == [("bf16-amp", 0), ("fp32", 0)]
    bf16 = record.trial("bf16-amp")
    # the combined result keeps the first round's SQNR and kernel table
    assert bf16.quant_error is not None and bf16.quant_error.layers
    assert bf16.profiled_step is not None
    assert [s.round for s in bf16.steps] == [0, 0, 0, 1, 1, 1]
    # both rounds' phases are timed and add up
    assert bf16.phase_times["warm-up"] > 0 and "profiled step" in bf16.phase_times


def test_the_gpu_acceptance_asserts_the_sweep_goal(tmp_path, monkeypatch):
    """scripts/gpu_acceptance.py's sweep check: every recipe ok with 10 measured steps and
    the whole sweep within 60 s; it names where the time went (a real CPU record)."""
    import importlib.util

    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path))
    spec = importlib.util.spec_from_file_location("gpu_acceptance",
                                                  ROOT / "scripts" / "gpu_acceptance.py")
    acc = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = acc  # dataclasses look their module up while building
    spec.loader.exec_module(acc)
    monkeypatch.setattr(acc, "SWEEP", ("fp32",))
    record = Runner(RunConfig(**TINY, precisions=("fp32",), steps=10, warmup=1,
                              isolation="inline", profile_step=False)).run()
    assert acc.SWEEP_GOAL_S == 60
    assert acc.sweep_time_check(record, 59.9).passed is True
    late = acc.sweep_time_check(record, 60.1)
    assert late.passed is False and late.measured.startswith("60.1 s, 1 ok")
    measured = record.trials[0].phase_times["measured"]
    assert f"measured {measured:.1f}" in late.measured
    short = Runner(RunConfig(**TINY, precisions=("fp32",), steps=9, warmup=1,
                             isolation="inline", profile_step=False)).run()
    assert acc.sweep_time_check(short, 10.0).passed is False  # 9 steps are not the goal's 10
