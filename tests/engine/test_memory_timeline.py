"""The memory step's timeline, from real CPU trials on the tiny preset and another family."""

import functools
import itertools

import pytest

from engine.core.config import RunConfig
from engine.measure.device import probe
from engine.measure.memtrack import CATEGORIES
from engine.run.trial import run_trial
from tests.engine.families import causal_lm_folder

CPU = probe("cpu")
RECIPES = [("fp32", False), ("bf16-amp", False), ("bf16-amp", True), ("nf4", False)]
MODELS = ["tiny", "llama-gqa"]


@functools.cache
def _trial(model: str, precision: str, checkpointing: bool):
    config = RunConfig(model=model, batch_size=2, seq_len=32, steps=1, warmup=0, device="cpu",
                       isolation="inline", profile_step=False,
                       grad_checkpointing=checkpointing)
    result = run_trial(config, precision, CPU, lambda event: None, lambda: False)
    assert result.status == "ok", result.reason
    return result


@pytest.fixture(scope="module")
def trial(tmp_path_factory):
    def run(model, precision, checkpointing=False):
        if model != "tiny":
            model = causal_lm_folder(model, str(tmp_path_factory.getbasetemp() / model))
        return _trial(model, precision, checkpointing)
    return run


def _at(timeline, point) -> dict:
    return dict(zip(timeline.categories, point.category_bytes, strict=True))


def _phases(timeline) -> list[str]:
    return [phase for phase, _ in itertools.groupby(p.phase for p in timeline.points)]


@pytest.mark.parametrize(("model", "precision", "checkpointing"),
                         [(m, p, c) for m in MODELS for p, c in RECIPES])
def test_timeline_peak_is_the_reported_peak_with_its_categories(trial, model, precision,
                                                                checkpointing):
    result = trial(model, precision, checkpointing)
    timeline, memory = result.memory_timeline, result.memory
    totals = [sum(p.category_bytes) for p in timeline.points]
    assert max(totals) == memory.total_bytes == timeline.peak_bytes
    assert totals.index(max(totals)) == timeline.peak_index
    at_peak = _at(timeline, timeline.points[timeline.peak_index])
    assert at_peak == {c: getattr(memory, f"{c}_bytes") for c in CATEGORIES}
    assert timeline.points[timeline.peak_index].phase.split()[0] == memory.peak_phase \
        or memory.peak_phase == "backward"  # a recompute runs inside backward
    assert len(timeline.points) <= 450 and timeline.changes >= len(timeline.points)
    ops = [p.op_index for p in timeline.points]
    assert ops == sorted(ops) and ops[-1] <= timeline.ops
    # independently of the watcher: what the step begins and ends with
    first, last = _at(timeline, timeline.points[0]), _at(timeline, timeline.points[-1])
    assert first["grads"] == first["activations"] == first["temporaries"] == 0
    assert last["grads"] == 0 and last["activations"] == 0
    assert first["params"] == last["params"] == memory.params_bytes
    # every gradient is held when the optimizer step begins: one per trainable parameter,
    # in the trained weights' dtype (fp32 here: AMP's master weights, nf4's LoRA adapters)
    optimizer_start = next(p for p in timeline.points if p.phase == "optimizer")
    assert _at(timeline, optimizer_start)["grads"] == 4 * result.trainable_params
    # the module is known where a forward was running
    forward = [p for p in timeline.points if p.phase == "forward" and p.module]
    assert forward and all(p.module in _module_names(result) for p in forward)


def _module_names(result) -> set[str]:
    """The model's modules as the module tree names them (the root by its class)."""
    return {m.name or m.type for m in result.module_tree}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(("precision", "checkpointing"), RECIPES)
def test_phases_in_the_order_the_step_runs_them(trial, model, precision, checkpointing):
    phases = _phases(trial(model, precision, checkpointing).memory_timeline)
    if not checkpointing:
        assert phases == ["forward", "backward", "optimizer", "zero_grad"]
        return
    # each checkpointed layer reruns in backward, the last layer first
    assert phases[:2] == ["forward", "backward"] and phases[-2:] == ["optimizer", "zero_grad"]
    middle = phases[2:-2]
    layers = [p.removeprefix("recompute ") for p in middle[::2]]
    assert all(p.startswith("recompute ") for p in middle[::2])
    assert set(middle[1::2]) == {"backward"}
    assert len(layers) == 2 and layers == sorted(layers, reverse=True)
    assert all(layer.split(".")[-1].isdigit() for layer in layers)


@pytest.mark.parametrize("model", MODELS)
def test_checkpointing_moves_the_activations(trial, model):
    plain = trial(model, "bf16-amp", False).memory_timeline
    ckpt = trial(model, "bf16-amp", True).memory_timeline

    def activations(timeline, phase=None):
        return [_at(timeline, p)["activations"] for p in timeline.points
                if phase is None or p.phase.startswith(phase)]

    # backward begins with the layers' inputs only, and their forward reruns in backward
    begin = next(i for i, p in enumerate(ckpt.points) if p.phase == "backward")
    plain_begin = next(i for i, p in enumerate(plain.points) if p.phase == "backward")
    assert activations(ckpt)[begin] < activations(plain)[plain_begin] / 2
    assert max(activations(ckpt)) < max(activations(plain))
    recomputed = activations(ckpt, "recompute")
    assert recomputed and max(recomputed) > activations(ckpt)[begin]



def test_the_cli_writes_the_timeline_to_journal_and_report_and_reads_it_back(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from engine.record.journal import read_run

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "r.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AMPSCOPE_DATA_DIR": str(tmp_path / "data")}
    run = subprocess.run([sys.executable, "main.py", "profile", "--model", "tiny", "--precision",
                          "fp32", "--batch-size", "2", "--seq-len", "32", "--steps", "1",
                          "--warmup", "0", "--no-kernel-profile", "--quiet", "--out", str(out)],
                         cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    trial = json.loads(out.read_text())["trials"][0]
    timeline = trial["memory_timeline"]
    assert timeline["categories"] == list(CATEGORIES)
    totals = [sum(p["category_bytes"]) for p in timeline["points"]]
    assert max(totals) == trial["memory"]["total_bytes"]
    assert {p["phase"] for p in timeline["points"]} == {"forward", "backward", "optimizer",
                                                         "zero_grad"}
    (journal,) = (tmp_path / "data" / "runs").glob("*.jsonl")
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    done = [line for line in lines if line.get("e") == "done"]
    assert done and done[0]["result"]["memory_timeline"]["points"] == timeline["points"]
    for path in (out, journal):  # read back through the validating readers
        back = read_run(str(path)).trials[0].memory_timeline
        assert back.peak_bytes == trial["memory"]["total_bytes"]
        assert len(back.points) == len(timeline["points"])


def _report_with(timeline: dict) -> dict:
    return {"schema_version": 1, "trials": [{"precision": "fp32", "status": "ok",
                                            "memory_timeline": timeline}]}


def test_a_damaged_timeline_is_refused_with_where_and_why():
    from engine.record.validate import validate_report

    good = {"categories": ["params", "activations"], "peak_index": 1, "peak_bytes": 30,
            "ops": 4, "changes": 2,
            "points": [{"op_index": 0, "phase": "forward", "category_bytes": [10, 0]},
                       {"op_index": 3, "phase": "forward", "category_bytes": [10, 20]}]}
    validate_report(_report_with(good))
    short = {**good, "points": [good["points"][0], {**good["points"][1],
                                                    "category_bytes": [10]}]}
    with pytest.raises(ValueError, match=r"memory_timeline\.points\[1\]\.category_bytes: "
                                         "expected 2 byte counts"):
        validate_report(_report_with(short))
    backwards = {**good, "points": [good["points"][1], good["points"][0]]}
    with pytest.raises(ValueError, match="op indices go backwards"):
        validate_report(_report_with(backwards))
    with pytest.raises(ValueError, match="peak_index: is not the point holding peak_bytes"):
        validate_report(_report_with({**good, "peak_index": 0}))
