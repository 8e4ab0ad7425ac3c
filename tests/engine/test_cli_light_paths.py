"""Paths of the real ``python3 main.py`` that need no torch do not load it: a wrong
``--model`` or ``--out`` is refused in one line before torch, transformers or matplotlib
load, in this process or a child it starts (the trials' forkserver inherits ``-X
importtime`` and the stderr pipe, so its imports would show here too), and a JSON report of
a run on a card without fp8 rates is written without them: a user's typo costs a fraction
of a second, not seconds of imports."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "matplotlib")


def _main(args, tmp_path, code: int = 2) -> tuple[str, list[str], set[str]]:
    """What ``main.py`` printed, the lines it said on stderr (importtime's left out) and the
    modules imported."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AMPSCOPE_DATA_DIR": str(tmp_path / "data")}
    run = subprocess.run([sys.executable, "-X", "importtime", "main.py", *args], cwd=ROOT,
                         text=True, capture_output=True, env=env, timeout=300)
    assert run.returncode == code, run.stderr[-2000:]
    lines = run.stderr.splitlines()
    imported = {line.rsplit("|", 1)[1].strip() for line in lines
                if line.startswith("import time:") and "|" in line}
    assert "json" in imported  # importtime reached us: an empty set would prove nothing
    return run.stdout, [line for line in lines if not line.startswith("import time:")], imported


def _refusal(args, tmp_path) -> tuple[list[str], set[str]]:
    stdout, said, imported = _main(args, tmp_path)
    assert stdout == ""
    return said, imported


@pytest.mark.parametrize("command", ["profile", "plan", "footprint", "numerics", "fit"])
def test_a_model_folder_that_does_not_exist_is_refused_before_heavy_imports(command,
                                                                             tmp_path):
    missing = tmp_path / "no-such-model"
    said, imported = _refusal([command, "--model", str(missing)], tmp_path)
    assert said == [f"ampscope: error: model folder '{missing}' does not exist: check the "
                    "path, or pick a preset (python main.py presets)"]
    assert not imported & set(HEAVY), imported & set(HEAVY)


@pytest.mark.parametrize("command", ["profile", "numerics"])
def test_an_out_in_a_missing_folder_is_refused_before_heavy_imports(command, tmp_path):
    folder = tmp_path / "not-made"
    said, imported = _refusal([command, "--model", "tiny", "--out", str(folder / "r.json")],
                              tmp_path)
    assert said == [f"ampscope: error: folder {folder} does not exist: create it or choose "
                    "another --out"]
    assert not imported & set(HEAVY), imported & set(HEAVY)
    assert not folder.exists()  # nothing half-written


def test_an_out_with_an_unknown_extension_is_refused_before_heavy_imports(tmp_path):
    said, imported = _refusal(["profile", "--model", "tiny", "--out",
                               str(tmp_path / "r.txt")], tmp_path)
    assert said == ["ampscope: error: unknown report extension '.txt': use .json, .csv or "
                    ".html"]
    assert not imported & set(HEAVY), imported & set(HEAVY)
    assert list(tmp_path.glob("r*")) == []


def test_a_json_report_of_a_run_on_a_card_without_fp8_rates_needs_no_torch(tmp_path):
    from engine.core.events import RunFinished, RunStarted, StepSample, TrialStarted
    from engine.record.journal import JournalWriter

    card = "Some Test CPU @ 1.00GHz"
    table = json.loads((ROOT / "resources" / "peak_flops.json").read_text())
    assert card not in json.dumps(table)  # no rate to weigh fp8 against: the payoff is a reason
    journal = tmp_path / "cpu.jsonl"
    writer = JournalWriter(journal)
    writer.write(RunStarted("light01", {"model": "tiny", "precisions": ["fp32"],
                                        "batch_size": 1, "seq_len": 16},
                            {"device": {"name": card}}, 1.8e9))
    writer.write(TrialStarted("fp32", 0, 1, 1.8e9))
    for i in range(3):
        writer.write(StepSample(precision="fp32", step=i, warmup=i == 0, loss=3.0 - i / 10,
                                step_ms=10.0 + i, tokens_per_s=None, tflops=None, mfu=None,
                                allocated_bytes=None, reserved_bytes=None, loss_scale=None,
                                skipped=False, grad_norm=1.0, time_s=1.8e9 + i, tokens=16))
    writer.write(RunFinished("ok", 1.8e9 + 3))
    writer.close()
    out = tmp_path / "r.json"
    stdout, said, imported = _main(["report", str(journal), "--out", str(out)], tmp_path, 0)
    assert stdout == f"report of run light01 (ok) written to {out}\n"
    assert said == []
    assert not imported & set(HEAVY), imported & set(HEAVY)
    payoff = json.loads(out.read_text())["payoff"]
    assert list(payoff) == [card] and set(payoff[card]) == {"reason"}
    assert card in payoff[card]["reason"]
