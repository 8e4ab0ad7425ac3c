"""How often compiled trials compile, and that no graph break goes unreported.

torch.compile runs with a counting backend that executes the captured graphs eagerly
(torch._dynamo.testing.CompileCounter), so these run on the CPU in seconds, not minutes.
"""

import dataclasses

import torch
from torch._dynamo.testing import CompileCounter

import engine.run.trial as trial_mod
from engine.core.config import RunConfig
from engine.measure import gating
from engine.measure.device import probe
from engine.models.load import load_model, make_batches
from engine.run.fit import FitConfig, fit_precision
from engine.run.trial import run_trial

CPU = probe("cpu")


def _counting_compile(monkeypatch) -> CompileCounter:
    counter = CompileCounter()
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model: real(model, backend=counter))
    return counter


def test_a_compiled_inline_trial_compiles_once_and_reports_its_graph_breaks(monkeypatch):
    config = RunConfig(model="tiny", batch_size=2, seq_len=32, steps=3, warmup=1,
                       device="cpu", isolation="inline", compile=True, profile_step=False)
    # what dynamo makes of one training forward of the same model, found apart from the trial
    loaded = load_model("tiny", "fp32", "cpu", config.seed)
    batch = make_batches(loaded.config, loaded.task, 2, 32, 1, config.seed, "cpu")[0]
    torch._dynamo.reset()
    explained = torch._dynamo.explain(loaded.model)(**batch)
    counter = _counting_compile(monkeypatch)
    logs = []
    result = run_trial(config, "fp32", CPU, logs.append, lambda: False)
    assert result.status == "ok", result.reason
    # compiled in the warm-up step only: the measured steps reuse the graphs
    assert counter.frame_count == explained.graph_count
    note = next(n for n in result.notes if n.startswith("torch.compile:"))
    reasons = {r.reason for r in explained.break_reasons}
    assert note.startswith(f"torch.compile: {explained.graph_count} graph")
    assert f"graph breaks for {len(reasons)} reason" in note
    if reasons:  # a silent fallback to eager would be a warning in the trial's log
        assert "ran eagerly; first: " in note
        assert any(getattr(e, "level", None) == "warning" and "graph break" in e.message
                   for e in logs)


def test_fit_probes_inline_start_from_a_reset_dynamo_each(monkeypatch):
    calls = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: calls.append("reset"))
    # fp8 compiles by default; compiling float8 for real would take minutes here
    monkeypatch.setattr(torch, "compile", lambda model: calls.append("compile") or model)
    real_run = trial_mod.run_trial

    def run(config, *args, **kwargs):
        calls.append(f"trial batch {config.batch_size}")
        return real_run(config, *args, **kwargs)

    monkeypatch.setattr(trial_mod, "run_trial", run)
    # a device with fp8 hardware as the gating matrix judges an H100: native, so compiled
    fp8_device = dataclasses.replace(CPU, unsupported={}, fp8_supported=True, verdicts={
        "fp8": gating.Verdict("native", "fp8 Tensor Cores")})
    config = FitConfig(model="tiny", precisions=("fp8",), seq_len=16, max_batch=2,
                       memory_budget_bytes=8 * 2**30, device="cpu", isolation="inline")
    result = fit_precision(config, "fp8", fp8_device, config.memory_budget_bytes)
    assert [p.batch_size for p in result.probes] == [1, 2], result.reason
    assert calls == ["trial batch 1", "reset", "compile", "trial batch 2", "reset", "compile"]


def test_interleaved_compiled_rounds_each_compile_afresh_and_say_how_much(monkeypatch):
    from engine.run.runner import Runner

    counter = _counting_compile(monkeypatch)
    notes = []  # each round's trial: its compile note, and the backend's count around it
    real_run = trial_mod.run_trial

    def run(config, precision, *args, **kwargs):
        before = counter.frame_count
        result = real_run(config, precision, *args, **kwargs)
        note = next((n for n in result.notes if n.startswith("torch.compile:")), None)
        notes.append((precision, note, counter.frame_count - before))
        return result

    monkeypatch.setattr(trial_mod, "run_trial", run)
    config = RunConfig(model="tiny", precisions=("fp32", "bf16-amp"), batch_size=2,
                       seq_len=32, steps=4, warmup=1, rounds=2, interleave="on",
                       compile=True, device="cpu", isolation="inline", profile_step=False)
    record = Runner(config).run()
    assert [t.status for t in record.trials] == ["ok", "ok"]
    # mirrored rounds (engine/run/rounds.py): A B, then B A
    assert [p for p, _, _ in notes] == ["fp32", "bf16-amp", "bf16-amp", "fp32"]
    for precision in ("fp32", "bf16-amp"):
        rounds = [(note, frames) for p, note, frames in notes if p == precision]
        # the backend saw as many graphs as the trial's note says, in round 2 as in round 1:
        # no round reused another's graphs or ran eagerly for want of recompiles
        for note, frames in rounds:
            assert frames >= 1 and note.startswith(f"torch.compile: {frames} graph")
        assert rounds[0] == rounds[1]
