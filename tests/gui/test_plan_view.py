"""The Plan tab: the plan command's form, a traced step per recipe, a recipe x card table."""

import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from engine.core.config import RunConfig
from engine.measure.device import probe
from engine.run.plan_text import duration_text
from engine.run.trial import run_trial
from gui.main_window import MainWindow
from tests.gui.clicks import choose, click, type_into

TIMEOUT_MS = 300_000


@pytest.fixture
def window(qtbot):
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    qtbot.waitExposed(win)
    return win


def _open_plan_tab(window):
    bar = window.tabs.tabBar()
    index = next(i for i in range(bar.count()) if bar.tabText(i) == "Plan")
    QTest.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(index).center())
    assert window.tabs.currentWidget() is window.plan_view
    return window.plan_view


def _fill(view, precisions: str, cards: str) -> None:
    type_into(view.model, "tiny")
    type_into(view.precisions, precisions)
    type_into(view.batch, "2")
    type_into(view.seq, "32")
    type_into(view.cards, cards)
    type_into(view.max_batch, "0")


def test_plan_tab_shows_recipe_by_card(qtbot, window):
    view = _open_plan_tab(window)
    _fill(view, "fp32,bf16-amp", "RTX 4090,T4")
    with qtbot.waitSignal(view.worker.finished, timeout=TIMEOUT_MS):
        click(view.plan_button)
    assert view.table.rowCount() == 2
    # a real CPU trial of the same step: the traced peak agrees within 2%
    config = RunConfig(model="tiny", precisions=("fp32",), batch_size=2, seq_len=32, steps=1,
                       warmup=1, device="cpu", isolation="inline", profile_step=False)
    measured = run_trial(config, "fp32", probe("cpu"), lambda e: None, lambda: False)
    traced = view.last_result.trials[0].memory.total_bytes
    assert abs(traced - measured.memory.total_bytes) <= 0.02 * measured.memory.total_bytes
    assert view.cell(0, "Traced peak") == f"{traced / 2**20:.2f} MiB (traced)"
    usable = 24563 * 2**20 - 2**30  # the 4090 as CUDA reports it less the 1 GiB allowance
    assert view.cell(0, "NVIDIA GeForce RTX 4090") == (
        f"fits, {(usable - traced) / 2**30:.2f} GiB headroom")
    bf16_peak = view.last_result.trials[1].memory.total_bytes  # T4: 14930 MiB, CUDA's
    assert view.cell(1, "NVIDIA T4") == (
        f"fits, {(14930 * 2**20 - 2**30 - bf16_peak) / 2**30:.2f} GiB headroom")
    # the roofline's bound, in the card cell's tooltip, as the engine chose it
    card = view.last_result.trials[0].cards[0]
    assert card.bound in ("compute", "memory")
    tip = view.table.item(0, 3).toolTip()
    assert f"{duration_text(card.predicted_step_ms)} ({card.bound}-bound)" in tip
    assert "prediction (roofline" in tip
    # bf16-amp was traced under the card's autocast op lists, and the tooltip says which
    policy = view.last_result.trials[1].autocast_policy
    assert policy and view.last_result.trials[0].autocast_policy is None
    assert f"autocast traced: {policy}" in view.table.item(1, 1).toolTip()
    assert view.plan_button.isEnabled()


def test_plan_tab_accumulates_gradients(qtbot, window):
    """Gradient accumulation typed into the form: the traced step holds the first
    micro-batch's gradients through the second, as a real trial with --grad-accum 2."""
    view = _open_plan_tab(window)
    _fill(view, "fp32", "RTX 4090")
    type_into(view.grad_accum, "2")
    with qtbot.waitSignal(view.worker.finished, timeout=TIMEOUT_MS):
        click(view.plan_button)
    assert view.last_result.grad_accum == 2
    config = RunConfig(model="tiny", precisions=("fp32",), batch_size=2, seq_len=32, steps=1,
                       warmup=1, device="cpu", isolation="inline", profile_step=False,
                       grad_accum=2)
    measured = run_trial(config, "fp32", probe("cpu"), lambda e: None, lambda: False).memory
    traced = view.last_result.trials[0].memory
    assert abs(traced.total_bytes - measured.total_bytes) <= 0.02 * measured.total_bytes
    assert traced.peak_phase == measured.peak_phase == "backward"
    assert "x 2 micro-batches" in view.status.text()


def test_plan_tab_plans_one_fsdp2_rank(qtbot, window):
    """FSDP2 over 4 ranks picked in the form: rank 0 holds a quarter of the tiny GPT-2's
    fp32 weights (every parameter's first dimension divides by 4), counted here."""
    import torch
    import transformers as tf

    view = _open_plan_tab(window)
    _fill(view, "fp32", "RTX 4090")
    choose(view.strategy, "fsdp2")
    type_into(view.nproc, "4")
    with qtbot.waitSignal(view.worker.finished, timeout=TIMEOUT_MS):
        click(view.plan_button)
    result = view.last_result
    assert result.strategy == "fsdp2" and result.nproc_per_node == 4
    cfg = tf.GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=1024, n_positions=512)
    with torch.device("meta"):
        n = sum(p.numel() for p in tf.GPT2LMHeadModel(cfg).parameters())
    assert result.trials[0].memory.params_bytes == 4 * n // 4
    assert "FSDP2, per rank of 4" in view.status.text()


def test_plan_tab_refuses_an_unknown_card_inline(qtbot, window):
    view = _open_plan_tab(window)
    _fill(view, "fp32", "RTX 9999")
    click(view.plan_button)
    assert not view.error_label.isHidden()
    assert "unknown card 'RTX 9999'" in view.error_label.text()
    assert view.table.rowCount() == 0 and not view.worker.is_running()


def test_plan_tab_shows_a_real_trial_beside_the_traced_one(qtbot, window, tmp_path,
                                                           monkeypatch):
    """A CPU profile of the same shape, run through the CLI (in this process: the command
    line's parser and handler) into the window's data folder: the Measured peak column
    shows its figure, and its tooltip every category; the named report field finds the
    same trial in a report from elsewhere."""
    import json

    from tests.cli_in_process import run_cli

    report = tmp_path / "real.json"
    run = run_cli("profile", "--model", "tiny", "--precision", "fp32", "--batch-size", "2",
                  "--seq-len", "32", "--steps", "1", "--warmup", "1", "--device", "cpu",
                  "--isolation", "inline", "--no-kernel-profile", "--quiet", "--out",
                  str(report))
    assert run.returncode == 0, run.stderr
    real = json.loads(report.read_text(encoding="utf-8"))
    memory = real["trials"][0]["memory"]
    view = _open_plan_tab(window)
    _fill(view, "fp32,bf16-amp", "RTX 4090")
    with qtbot.waitSignal(view.worker.finished, timeout=TIMEOUT_MS):
        click(view.plan_button)
    assert view.cell(0, "Measured peak") == (
        f"{memory['total_bytes'] / 2**20:.2f} MiB (run {real['run_id']})")
    assert view.cell(1, "Measured peak") == "none"  # bf16-amp was not profiled
    col = [view.table.horizontalHeaderItem(c).text()
           for c in range(view.table.columnCount())].index("Measured peak")
    tip = view.table.item(0, col).toolTip()
    assert f"optimizer: traced {memory['optimizer_bytes'] / 2**20:.2f} MiB" in tip
    assert f"measured {memory['optimizer_bytes'] / 2**20:.2f} MiB" in tip

    # the same report named in the form, from a history that does not hold it
    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path / "elsewhere"))
    type_into(view.measured, str(report))
    with qtbot.waitSignal(view.worker.finished, timeout=TIMEOUT_MS):
        click(view.plan_button)
    assert view.last_result.trials[0].measured.source == str(report)


def test_plan_tab_shows_an_unknown_models_reason_first(qtbot, window):
    """A misspelt model typed into the form: the reason (and the preset it may mean) is the
    first thing in the tab, above the form; no table of n/a behind it."""
    view = _open_plan_tab(window)
    _fill(view, "fp32", "RTX 4090")
    type_into(view.model, "lama-7b")
    with qtbot.waitSignal(view.worker.errored, timeout=TIMEOUT_MS):
        click(view.plan_button)
    qtbot.waitUntil(view.plan_button.isEnabled)
    text = view.error_label.text()
    assert view.error_label.isVisible()
    assert text.startswith("'lama-7b' is not a preset") and "did you mean llama-7b" in text
    assert view.error_label.geometry().bottom() <= view.model.geometry().top()
    assert view.table.rowCount() == 0 and not view.answer.isVisible()


def test_plan_tab_answers_on_top(qtbot, window):
    """The answer per card, as the CLI's first lines, above the form and the table."""
    view = _open_plan_tab(window)
    _fill(view, "fp32,bf16", "RTX 4090,A10")
    with qtbot.waitSignal(view.worker.finished, timeout=TIMEOUT_MS):
        click(view.plan_button)
    result = view.last_result
    lines = view.answer.text().splitlines()
    assert view.answer.isVisible() and len(lines) == 2
    fp32, bf16 = (t.cards[0] for t in result.trials)
    best = max((fp32, "fp32"), (bf16, "bf16"), key=lambda c: c[0].headroom_bytes)
    assert lines[0].startswith("tiny on NVIDIA GeForce RTX 4090: fp32, bf16 fit as asked; "
                               f"{best[1]} leaves the most room")
    assert lines[0].endswith(f", {best[0].headroom_bytes / 2**30:.1f} GiB to spare (traced)")
    assert "datasheet's nominal capacity" in lines[1]  # the A10's 24 GB
    assert view.answer.geometry().bottom() <= view.table.geometry().top()


def test_plan_tab_refuses_a_plan_the_bounds_check_refuses(qtbot, window, tmp_path):
    """An FSDP2 world larger than the model's largest parameter has rows, typed into the
    Plan tab: refused before tracing, in one line that says what to do, as ``main.py plan``
    does (engine/run/plan_bounds.py). (A million repeating layers is no longer refused: the
    plan traces the model cut to a few repeats and scales.)"""
    import json

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "gpt2", "n_embd": 64, "n_head": 2, "vocab_size": 1000,
        "n_positions": 128, "bos_token_id": 0, "eos_token_id": 0, "n_layer": 2}))
    view = _open_plan_tab(window)
    _fill(view, "fp32", "RTX 4090")
    type_into(view.model, str(tmp_path))
    choose(view.strategy, "fsdp2")
    type_into(view.nproc, "5000")
    with qtbot.waitSignal(view.worker.errored, timeout=TIMEOUT_MS):
        click(view.plan_button)
    qtbot.waitUntil(view.plan_button.isEnabled)
    text = view.error_label.text()
    assert view.error_label.isVisible()
    # the largest parameter is the token embedding: vocab_size rows
    assert "--nproc-per-node 5,000 is more ranks than" in text and "(1,000)" in text, text
    assert "plan at most 1,000 ranks" in text
    assert view.table.rowCount() == 0


def test_plan_tab_shows_progress_and_stop_keeps_the_recipes_done(qtbot, window):
    """Plan pressed: the status names each trace as it starts and counts the recipes done;
    each recipe's row appears once judged; Stop ends the plan at its next trace, its rows
    kept, with no answer (which needs every recipe)."""
    view = _open_plan_tab(window)
    recipes = ("fp32", "bf16-amp", "fp16-amp", "bf16", "fp16")
    _fill(view, ",".join(recipes), "RTX 4090")
    seen = []
    view.worker.progress.connect(lambda _msg: seen.append(view.status.text()))
    assert not view.stop_button.isEnabled()
    with qtbot.waitSignal(view.worker.partial, timeout=TIMEOUT_MS) as first:
        click(view.plan_button)
    assert view.stop_button.isEnabled() and not view.plan_button.isEnabled()
    assert seen[0].startswith("0 of 5 recipes planned; now fp32: tracing"), seen
    assert view.table.rowCount() == 1 and view.cell(0, "Recipe") == "fp32"
    with qtbot.waitSignal(view.worker.stopped, timeout=TIMEOUT_MS) as stopped:
        click(view.stop_button)
    kept = stopped.args[0]
    assert kept is not None and first.args[0].trials[0].precision == "fp32"
    done = len(kept.trials)
    assert 1 <= done < len(recipes)  # stopped between traces, not run to the end
    assert view.table.rowCount() == done
    assert [view.cell(r, "Recipe") for r in range(done)] == list(recipes[:done])
    assert view.status.text().startswith(f"Stopped: {done} of 5 recipes planned")
    assert not view.answer.isVisible()
    assert view.plan_button.isEnabled() and not view.stop_button.isEnabled()
    # pressed again, it plans afresh: the counts start over
    seen.clear()
    with qtbot.waitSignal(view.worker.partial, timeout=TIMEOUT_MS):
        click(view.plan_button)
    assert seen[0].startswith("0 of 5 recipes planned"), seen
    with qtbot.waitSignal(view.worker.stopped, timeout=TIMEOUT_MS):
        click(view.stop_button)


def test_plan_tab_gives_every_recipe_planned_a_row(qtbot, window, tmp_path):
    """A 1.9-billion-parameter Llama-style config (two layers, traced on fake tensors) whose
    fp32 step does not fit a T4: the answer plans 8-bit AdamW, int8 and nf4, each alone and
    with checkpointing, and each gets a row beside the recipe asked, its T4 cell that of
    planning the change directly; the first line is the CLI's."""
    import dataclasses
    import json

    from engine.run.plan import plan
    from engine.run.plan_text import format_plan

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 8192, "intermediate_size": 16384,
        "num_hidden_layers": 2, "num_attention_heads": 64, "num_key_value_heads": 8,
        "vocab_size": 32000, "max_position_embeddings": 512, "bos_token_id": 1,
        "eos_token_id": 2}))
    view = _open_plan_tab(window)
    _fill(view, "fp32", "T4")
    type_into(view.model, str(tmp_path))
    type_into(view.batch, "1")
    with qtbot.waitSignal(view.worker.finished, timeout=TIMEOUT_MS):
        click(view.plan_button)
    result = view.last_result
    labels = [view.cell(r, "Recipe") for r in range(view.table.rowCount())]
    assert labels[0] == "fp32"
    for change in ("fp32 with 8-bit AdamW (--optimizer adamw8bit)",
                   "int8 as LoRA on 8-bit weights (int8)",
                   "nf4 as QLoRA with 4-bit weights (nf4)",
                   "nf4 as QLoRA with 4-bit weights (nf4) and gradient checkpointing"):
        assert change in labels, labels
    assert len(labels) == 1 + len(result.lever_trials)
    assert view.cell(0, "NVIDIA T4").startswith("does not fit")
    # nf4 with checkpointing planned directly: its peak against the T4's usable memory
    # (14930 MiB as CUDA reports it, less the 1 GiB context allowance)
    direct = plan(dataclasses.replace(view.config(), precisions=("nf4",),
                                      grad_checkpointing=True, levers=False))
    spare = 14930 * 2**20 - 2**30 - direct.trials[0].memory.total_bytes
    row = labels.index("nf4 as QLoRA with 4-bit weights (nf4) and gradient checkpointing")
    assert view.cell(row, "NVIDIA T4") == f"fits, {spare / 2**30:.2f} GiB headroom"
    first = view.answer.text().splitlines()[0]
    assert first == format_plan(result).splitlines()[0]
    assert first.endswith("no recipe fits as asked; QLoRA with 4-bit weights (nf4) and "
                          f"gradient checkpointing, {spare / 2**30:.1f} GiB to spare (traced)")


def test_plan_tab_charts_are_readable_at_1366_by_768(qtbot, window):
    """At a laptop's 1366 x 768 each recipe's chart keeps a plot area at least 150 px high,
    and the card's usable-memory label lies inside it, clear of the phases' labels."""
    import pyqtgraph as pg

    window.resize(1366, 768)
    view = _open_plan_tab(window)
    _fill(view, "fp32,bf16-amp", "RTX 4090")
    with qtbot.waitSignal(view.worker.finished, timeout=TIMEOUT_MS):
        click(view.plan_button)
    qtbot.wait(50)  # the charts laid out
    plots = view.timeline.plots
    assert len(plots) == 2
    for plot in plots:
        area = plot.vb.sceneBoundingRect()
        assert area.height() >= 150, area
        (usable,) = [i for i in plot.items if isinstance(i, pg.InfiniteLine) and i.angle == 0]
        label = usable.label.sceneBoundingRect()
        assert area.contains(label), (area, label)
        phases = [i.sceneBoundingRect() for i in plot.items if isinstance(i, pg.TextItem)
                  and i is not usable.label]
        assert phases and not any(label.intersects(p) for p in phases)
