"""The Recorder refuses, at once and in one line, an argument it cannot use (issue #46): an
optimizer that is not a torch optimizer, a scaler that is not a GradScaler, a monitor rate
outside 0.1-100 Hz, each before a journal exists. A step value its own reader would refuse
(``tokens=10**30``) is dropped from that step with one warning in a real loop, and the run
it wrote opens in the real ``main.py report``."""

import json
import math
import subprocess
import sys
import warnings

import pytest
import torch

import ampscope
from ampscope.recorder_args import MONITOR_HZ
from tests.engine.test_recorder import padded_batch, tiny_gpt2, tiny_llama
from tests.engine.test_trainer_callback import ROOT

STEPS = 4


def _refused(tmp_path, fragment: str, **kwargs) -> None:
    model = tiny_gpt2()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    journal = tmp_path / "r.jsonl"
    args = {"optimizer": opt, **kwargs}
    with pytest.raises(ValueError) as refused:
        ampscope.Recorder(model, args.pop("optimizer"), args.pop("scaler", None),
                          journal=journal, **args)
    assert fragment in str(refused.value) and "\n" not in str(refused.value)
    assert not journal.exists()


def test_an_optimizer_that_is_not_one_is_refused(tmp_path):
    _refused(tmp_path, "optimizer must be a torch.optim.Optimizer", optimizer=object())


def test_a_scaler_that_is_not_a_grad_scaler_is_refused(tmp_path):
    _refused(tmp_path, "scaler must be a torch.amp.GradScaler, got str", scaler="yes")


@pytest.mark.parametrize("hz", [math.inf, 1e-300, 0, -5.0, math.nan, 1e6, True, "5"])
def test_a_monitor_rate_outside_the_range_is_refused(tmp_path, hz):
    low, high = MONITOR_HZ
    _refused(tmp_path, f"monitor_hz must be a number from {low:g} to {high:g}", monitor_hz=hz)


@pytest.mark.parametrize("hz", [math.inf, 1e-300])
def test_the_trainer_callback_refuses_the_same_rates(hz):
    with pytest.raises(ValueError, match="monitor_hz must be a number from"):
        ampscope.AmpScopeCallback(monitor_hz=hz)


@pytest.mark.parametrize("build", [tiny_gpt2, tiny_llama])
def test_an_implausible_token_count_is_dropped_from_its_step(tmp_path, build):
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    journal, out = tmp_path / "t.jsonl", tmp_path / "t.json"
    given = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ampscope.Recorder(model, opt, journal=journal) as rec:
            for i in range(STEPS):
                batch = padded_batch(i)
                loss = model(**batch).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
                given.append(10**30 if i == 2 else int(batch["attention_mask"].sum()))
                rec.step(loss=loss, tokens=given[-1])
    said = [str(w.message) for w in caught if "no run can have" in str(w.message)]
    assert len(said) == 1 and "step 2" in said[0] and "tokens" in said[0]
    run = subprocess.run([sys.executable, "main.py", "report", str(journal), "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    (trial,) = json.loads(out.read_text())["trials"]
    steps = {s["step"]: s for s in trial["steps"]}
    assert sorted(steps) == list(range(STEPS))  # the run is kept, every step in it
    assert steps[2]["tokens"] is None and steps[2]["tokens_per_s"] is None
    assert steps[2]["step_ms"] > 0 and steps[2]["loss"] is not None
    for i in (0, 1, 3):
        assert steps[i]["tokens"] == given[i]
        assert steps[i]["tokens_per_s"] == pytest.approx(given[i] / (steps[i]["step_ms"] / 1e3))
