"""The fp8 payoff table in the window: beside the plan (Plan tab, after pressing Plan) and
beside a run's comparison (File > Open, Compare > fp8 payoff). Each figure shown is checked
against the payoff model applied here to the model's own Linear layers; every one is
labelled predicted."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers as tf
from PySide6.QtWidgets import QFileDialog
from transformers.pytorch_utils import Conv1D

from engine.core.resources import RESOURCES
from engine.measure.fp8_payoff import RECIPES, Layer, layer_payoff
from engine.measure.peaks import memory_bandwidth, peak_flops
from gui.payoff_view import MEASURED, PREDICTED
from tests.engine.test_h200_reports import unpack
from tests.gui.clicks import RUN_TIMEOUT_MS, choose, click, click_tab, shown_window, type_into

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def window(qtbot):
    win = shown_window(qtbot)
    return win


def _layers(config) -> dict[str, tuple[int, int]]:
    """Each GPT-2 block projection (Conv1D stores (in, out)) -> (K, N), from transformers."""
    with torch.device("meta"):
        model = tf.GPT2LMHeadModel(config)
    return {name: tuple(mod.weight.shape) for name, mod in model.named_modules()
            if isinstance(mod, Conv1D)}


def _expected(layers, tokens, label, card):
    recipe = next(r for r in RECIPES if r.label == label)
    rates = (peak_flops(card, "bf16").flops_per_s, peak_flops(card, "fp8").flops_per_s,
             memory_bandwidth(card).bytes_per_s)
    return {name: layer_payoff(Layer(name, tokens, k, n), recipe, *rates)
            for name, (k, n) in layers.items()}


def _rows(view) -> dict[str, dict]:
    return {view.cell(r, "Layers"): {h: view.cell(r, h) for h in
                                     ("M x K x N", "Speed-up (predicted)", "Pays?", "Why")}
            for r in range(view.table.rowCount())}


def _check_rows(view, expected) -> None:
    """One row per name but for block numbers, and shape ('2 x transformer.h.*.mlp.c_fc'):
    its shape, speed-up and verdict."""
    rows = _rows(view)
    assert sum(int(k.split(" x ")[0]) if " x " in k else 1 for k in rows) == len(expected)
    for name, p in expected.items():
        pattern = re.sub(r"\.\d+\.", ".*.", name)
        (row,) = [r for k, r in rows.items() if k in (name, f"{k.split(' x ')[0]} x {pattern}")]
        assert row["M x K x N"] == f"{p.m} x {p.k} x {p.n}"
        assert row["Speed-up (predicted)"] == f"x{p.speedup:.2f}"
        assert row["Pays?"] == ("pays" if p.pays else "does not pay")
        assert row["Why"].endswith("below break-even") == (not p.pays)


def test_plan_tab_shows_the_payoff_per_card_and_recipe(qtbot, window):
    view = window.plan_view
    click_tab(window.tabs, "Plan")
    type_into(view.model, "tiny")
    type_into(view.precisions, "bf16-amp")
    type_into(view.batch, "2")
    type_into(view.seq, "32")
    type_into(view.cards, "H200 SXM,RTX 4090")
    type_into(view.max_batch, "0")
    with qtbot.waitSignal(view.payoff.finished, timeout=RUN_TIMEOUT_MS):
        click(view.plan_button)
    payoff = view.payoff
    assert payoff.basis.text() == PREDICTED and "peak --fp8-shapes" in PREDICTED
    preset = next(p["config"] for p in json.loads((RESOURCES / "presets.json").read_text())
                  ["presets"] if p["name"] == "tiny")
    layers = _layers(tf.GPT2Config(**preset))
    steps = {c.card: c.predicted_step_ms for c in view.last_result.trials[0].cards}
    for card in ("NVIDIA H200 SXM", "NVIDIA GeForce RTX 4090"):
        for label in ("fp8", "fp8-rowwise"):
            expected = _expected(layers, 2 * 32, label, card)
            step = steps[card]
            basis = max(step, sum(p.bf16_us for p in expected.values()) / 1e3)
            saved = sum(p.bf16_us - p.low_us for p in expected.values()) / 1e3
            paying = sum(p.pays for p in expected.values())
            title = (f"{card} · {label}: step x{basis / (basis - saved):.3f} (predicted), "
                     f"{paying} of {len(expected)} layers pay")
            choose(payoff.choice, title)  # the keyboard picks it, as a person would
            _check_rows(payoff, expected)
            assert "predicted" in payoff.verdict.text()
            assert payoff.verdict.text().startswith(f"{label} would not pay for tiny")
            assert payoff.filter.text() == "no layer pays: keep this model in bf16"
            assert {payoff.cell(r, MEASURED) for r in range(payoff.table.rowCount())} == {
                "n/a: predicted only"}  # no timing of these shapes on these cards is cached


def test_plan_tab_shows_a_cards_cached_timings_beside_the_prediction(qtbot, window, tmp_path,
                                                                      monkeypatch):
    """A timing of the tiny preset's shapes on an H100 (written here in the documented
    format of main.py peak --fp8-shapes' cache) shows in the H100's measured column."""
    preset = next(p["config"] for p in json.loads((RESOURCES / "presets.json").read_text())
                  ["presets"] if p["name"] == "tiny")
    layers = _layers(tf.GPT2Config(**preset))
    shapes = {(64, k, n) for k, n in layers.values() if k % 16 == 0 and n % 16 == 0}
    device = "NVIDIA H100 80GB HBM3"
    fake = {f"{m}x{k}x{n}": {"m": m, "k": k, "n": n, "bf16": {"median_ms": 1 + n / 1000},
                             "fp8": {"median_ms": 0.9}, "fp8-rowwise": {"median_ms": 1.1}}
            for m, k, n in shapes}
    monkeypatch.setenv("AMPSCOPE_CACHE_DIR", str(tmp_path))
    entry = {"device": device, "kind": "cuda", "measured_at_s": 1.0, "shapes": fake}
    (tmp_path / "fp8_shape_timing.json").write_text(
        json.dumps({f"{device} | torch {torch.__version__}": entry}), encoding="utf-8")
    view = window.plan_view
    click_tab(window.tabs, "Plan")
    for box, text in ((view.model, "tiny"), (view.precisions, "bf16-amp"), (view.batch, "2"),
                      (view.seq, "32"), (view.cards, "H100 SXM,H200 SXM"),
                      (view.max_batch, "0")):
        type_into(box, text)
    with qtbot.waitSignal(view.payoff.finished, timeout=RUN_TIMEOUT_MS):
        click(view.plan_button)
    payoff = view.payoff
    for card, measured in (("NVIDIA H100 SXM5", True), ("NVIDIA H200 SXM", False)):
        for label in ("fp8", "fp8-rowwise"):
            title = next(payoff.choice.itemText(i) for i in range(payoff.choice.count())
                         if payoff.choice.itemText(i).startswith(f"{card} · {label}:"))
            choose(payoff.choice, title)
            rows = range(payoff.table.rowCount())
            assert len(rows) > 1
            for r in rows:
                m, k, n = (int(v) for v in payoff.cell(r, "M x K x N").split(" x "))
                figures = fake[f"{m}x{k}x{n}"]
                ratio = figures["bf16"]["median_ms"] / figures[label]["median_ms"]
                assert payoff.cell(r, MEASURED) == (f"x{ratio:.2f} on {device}" if measured
                                                    else "n/a: predicted only")


def test_compare_tab_shows_the_payoff_of_the_h200_run(qtbot, window, tmp_path, monkeypatch):
    """The H200's compiled bf16-amp run of GPT-2 small at 8 x 1024, opened: fp8 would not
    pay there (its compiled fp8 run measured 31.4 ms against 23.4)."""
    path = unpack("02-gpt2-bf16-amp.json", tmp_path)
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(path), "")))
    file_menu = window.menuBar().actions()[0].menu()
    open_action = next(a for a in file_menu.actions() if a.text().startswith("&Open"))
    with qtbot.waitSignal(window.record_shown, timeout=RUN_TIMEOUT_MS):
        open_action.trigger()
    click_tab(window.tabs, "Compare")
    compare = window.compare_view
    payoff = compare.payoff
    qtbot.waitUntil(lambda: payoff.choice.count() > 0, timeout=RUN_TIMEOUT_MS)
    click_tab(compare.tables, "fp8 payoff")
    measured = window.record.trials[0].summary.median_step_ms
    layers = _layers(tf.GPT2Config())  # GPT-2 small: 12 blocks of 768
    for label in ("fp8", "fp8-rowwise"):
        expected = _expected(layers, 8 * 1024, label, "NVIDIA H200")
        saved = sum(p.bf16_us - p.low_us for p in expected.values()) / 1e3
        step = measured / (measured - saved)
        assert step < 1.0
        choose(payoff.choice, f"NVIDIA H200 · {label}: step x{step:.3f} (predicted), 0 of "
                              f"{len(expected)} layers pay")
        _check_rows(payoff, expected)
        assert "this run's bf16-amp step (measured median, compiled)" in payoff.verdict.text()
    # legible at 1366 x 768: every row (four kinds of layer) whole, every column begun
    table = payoff.table
    assert table.isVisible() and table.rowCount() == 4
    qtbot.waitUntil(lambda: table.viewport().height() >= 4 * table.rowHeight(0))
    header = table.horizontalHeader()
    assert all(header.sectionViewportPosition(c) < table.viewport().width()
               for c in range(table.columnCount()))


def test_compare_tab_names_the_layers_an_auto_trial_converted(qtbot, window, tmp_path,
                                                             monkeypatch):
    """A CPU run of fp8:auto weighed on an H20 (--card), opened: the payoff tab shows the
    H20's table and what the trial converted (at 64 tokens, nothing: every layer bf16)."""
    out = tmp_path / "auto.json"
    run = subprocess.run(
        [sys.executable, "main.py", "profile", "--model", "tiny", "--precision", "fp8:auto",
         "--card", "H20", "--batch-size", "2", "--seq-len", "32", "--steps", "1", "--warmup",
         "0", "--device", "cpu", "--isolation", "inline", "--data", "random",
         "--no-kernel-profile", "--no-quant-error", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, check=False,
        env={**os.environ, "AMPSCOPE_DATA_DIR": str(tmp_path / "data"),
             "AMPSCOPE_CACHE_DIR": str(tmp_path / "cache")})
    assert run.returncode == 0, run.stdout + run.stderr
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(out), "")))
    file_menu = window.menuBar().actions()[0].menu()
    open_action = next(a for a in file_menu.actions() if a.text().startswith("&Open"))
    with qtbot.waitSignal(window.record_shown, timeout=RUN_TIMEOUT_MS):
        open_action.trigger()
    click_tab(window.tabs, "Compare")
    payoff = window.compare_view.payoff
    qtbot.waitUntil(lambda: payoff.choice.count() > 0, timeout=RUN_TIMEOUT_MS)
    click_tab(window.compare_view.tables, "fp8 payoff")
    preset = next(p["config"] for p in json.loads((RESOURCES / "presets.json").read_text())
                  ["presets"] if p["name"] == "tiny")
    layers = _layers(tf.GPT2Config(**preset))
    expected = _expected(layers, 2 * 32, "fp8", "NVIDIA H20")
    assert not any(p.pays for p in expected.values())
    choose(payoff.choice, f"NVIDIA H20 · fp8: step n/a (predicted), 0 of {len(expected)} "
                          "layers pay")
    _check_rows(payoff, expected)
    assert payoff.auto.isVisible()
    assert payoff.auto.text() == (
        "fp8:auto: the payoff of NVIDIA H20 (--card; this trial ran on the CPU) at 64 tokens "
        f"per micro-batch (predicted, not measured): no layer pays, all {len(expected)} stayed "
        "in bf16 (its matmuls ran as bf16-amp's)")
