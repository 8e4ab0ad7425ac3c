"""A user's own loop in the window (issue #19): its lr, grad norm, time breakdown and
logged scalars are charted, opened from a journal, from History, or watched live; a run
of unknown length never reads 100% while it goes on, and a lone trial has no "vs fp32".

The journals are written by the real ``ampscope.Recorder`` around loops written here;
every charted value is checked against what the loop itself computed.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from PySide6.QtWidgets import QFileDialog

import ampscope
from engine.record.compare import COLUMNS
from engine.record.journal import read_journal
from gui.main_window import MainWindow
from tests.engine.test_recorder import padded_batch, tiny_gpt2, tiny_llama
from tests.gui.clicks import double_click
from tests.gui.test_watch_run import _menu_action

ROOT = Path(__file__).resolve().parents[2]
WAIT_MS = 120_000  # waits for the window and the writer process, does not time them
STEPS = 6


def _train(model, journal: Path | None) -> dict:
    """A loop as users write it: AdamW with a decaying schedule (the lr changes every
    step), an evaluation every other step logged with rec.log. Returns what the loop
    itself saw: the lr each optimizer step used, the gradients' 2-norm, the eval losses."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: 0.8**it)
    seen = {"lr": [], "grad_norm": [], "eval_loss": {}, "accuracy": {}}
    with ampscope.Recorder(model, opt, journal=journal) as rec:
        for it in range(STEPS):
            loss = model(**padded_batch(it)).loss
            loss.backward()
            grads = [p.grad.detach().float() for p in model.parameters() if p.grad is not None]
            seen["grad_norm"].append(float(torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g) for g in grads]))))
            seen["lr"].append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            if it % 2 == 1:
                model.eval()
                with torch.no_grad():
                    eval_loss = float(model(**padded_batch(100 + it)).loss)
                model.train()
                seen["eval_loss"][it] = eval_loss
                seen["accuracy"][it] = it / 10
                rec.log(eval_loss=eval_loss, accuracy=it / 10)
            rec.step(loss=loss)
    return seen


def _check_charts(win: MainWindow, seen: dict, journal: Path) -> None:
    charts = win.charts
    (precision,) = [t.precision for t in win.record.trials]
    x, lr = charts.curve_data("learning_rate", precision)
    assert list(x) == list(range(STEPS))
    assert lr == pytest.approx(seen["lr"], rel=1e-12)
    assert len(set(seen["lr"])) == STEPS  # the schedule moved it every step
    _, norm = charts.curve_data("grad_norm", precision)
    assert norm == pytest.approx(seen["grad_norm"], rel=1e-5)
    for name in ("eval_loss", "accuracy"):
        x, y = charts.curve_data("scalars", name)
        assert list(x) == list(seen[name]) and y == pytest.approx(list(seen[name].values()))
    # the stacked layers' tops: data, + forward, + backward, + optimizer, + evaluation
    steps = read_journal(journal).trials[0].steps
    top = np.zeros(STEPS)
    for field, name in (("data_ms", "data"), ("forward_ms", "forward"),
                        ("backward_ms", "backward"), ("optimizer_ms", "optimizer"),
                        ("eval_ms", "evaluation"), ("save_ms", "checkpoint save")):
        top += [(getattr(s, field) or 0.0) / 1000 for s in steps]
        x, y = charts.curve_data("step_breakdown", name)
        assert list(x) == list(range(STEPS)) and y == pytest.approx(top)
    assert top == pytest.approx([s.step_ms / 1000 for s in steps])
    for key in ("learning_rate", "grad_norm", "step_breakdown", "scalars"):
        assert charts.plots[key].isVisible()
    assert "eval_loss" in charts.plots["scalars"].titleLabel.text
    # one trial: nothing to compare against, so no "1.00x" / "0.0% saved"
    model = win.compare_view.model
    for key in ("speedup_vs_fp32", "memory_saving_vs_fp32"):
        column = [k for k, *_ in COLUMNS].index(key)
        assert model.index(0, column).data() == "n/a"
    assert "nothing to compare" in win.compare_view.note.text()


@pytest.mark.parametrize("build", [tiny_gpt2, tiny_llama])
def test_file_open_of_a_recorder_journal_charts_lr_grad_norm_breakdown_and_scalars(
        qtbot, tmp_path, monkeypatch, build):
    journal = tmp_path / "mine.jsonl"
    seen = _train(build(), journal)
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(journal), "")))
    with qtbot.waitSignal(win.record_shown, timeout=WAIT_MS):
        _menu_action(win, "File", "Open report or journal…").trigger()
    _check_charts(win, seen, journal)


def test_history_double_click_charts_a_recorder_run(qtbot, monkeypatch):
    from engine.record.journal import runs_dir

    seen = _train(tiny_llama(), None)  # journaled where History looks: runs/<run id>.jsonl
    (journal,) = runs_dir().glob("*.jsonl")
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    view = win.history_view
    view.refresh()
    run_id = read_journal(journal).run_id
    item = view.tree.topLevelItem(view.run_ids().index(run_id))
    win.tabs.setCurrentWidget(view)
    rect = view.tree.visualItemRect(item)
    with qtbot.waitSignal(win.record_shown, timeout=WAIT_MS):
        double_click(view.tree.viewport(), rect.center())
    win.tabs.setCurrentIndex(0)
    _check_charts(win, seen, journal)


# the same loop in its own process, as a user runs it; it holds the run open (inside the
# Recorder) until the test's go-ahead, and leaves what its loop saw in a JSON file
WRITER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from tests.engine.test_recorder import tiny_gpt2
    import tests.gui.test_user_run_charts as t
    import ampscope
    journal, go, seen_file = (Path(a) for a in sys.argv[1:4])
    real_step = ampscope.Recorder.step
    def step(self, *args, **kwargs):  # after the last step: wait for the test's go-ahead
        real_step(self, *args, **kwargs)
        if self._index == t.STEPS:
            while not go.exists():
                time.sleep(0.05)
    ampscope.Recorder.step = step
    seen = t._train(tiny_gpt2(), journal)
    seen_file.write_text(json.dumps(seen))
""")


def test_watching_a_recorder_run_shows_busy_progress_and_ends_without_running(
        qtbot, tmp_path, monkeypatch):
    journal, go, seen_file = tmp_path / "live.jsonl", tmp_path / "go", tmp_path / "seen.json"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    writer = subprocess.Popen(
        [sys.executable, str(script), str(journal), str(go), str(seen_file)], cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(journal), "")))
    try:
        qtbot.waitUntil(journal.exists, timeout=WAIT_MS)
        _menu_action(win, "File", "Watch run…").trigger()
        # the journal is a step behind the loop: all but the last step while it waits
        qtbot.waitUntil(lambda: [len(s) for s in win.record.live_steps.values()]
                        == [STEPS - 1], timeout=WAIT_MS)
        qtbot.wait(300)  # a few progress ticks
        assert writer.poll() is None
        # no known length: busy bars, never a share of a made-up total
        assert (win.run_progress.minimum(), win.run_progress.maximum()) == (0, 0)
        (precision,) = win.trial_table.precisions()
        bar = win.trial_table.cellWidget(0, 2)
        assert bar.maximum() == 0
        assert f"{STEPS - 1} steps so far" in win.statusBar().currentMessage()
        assert win.windowTitle().endswith("(running)")
        assert win.charts.curve_points("learning_rate", precision) == STEPS - 1
        go.touch()
        qtbot.waitUntil(lambda: win.record.status == "ok", timeout=WAIT_MS)
        assert writer.wait(timeout=120) == 0
    finally:
        writer.kill()
    qtbot.waitUntil(lambda: win.run_progress.format() == f"done: {STEPS} steps",
                    timeout=WAIT_MS)
    assert "running" not in win.windowTitle()
    assert win.windowTitle() == f"AmpScope — run {win.record.run_id}"
    assert bar.value() == bar.maximum() == 1
    seen = json.loads(seen_file.read_text())
    seen["eval_loss"] = {int(k): v for k, v in seen["eval_loss"].items()}
    seen["accuracy"] = {int(k): v for k, v in seen["accuracy"].items()}
    _check_charts(win, seen, journal)


def test_one_ranks_journal_shows_every_rank_merged_and_history_lists_the_run_once(
        qtbot, monkeypatch):
    """A user's own DDP loop under torchrun (two gloo ranks), journaled in the data folder:
    File > Open of either rank's journal shows the run merged, each rank in the Compare
    tab's rank charts; History lists the run once, opens it merged, deletes every rank."""
    from engine.record.journal import runs_dir
    from tests.engine.test_recorder_ddp import RANK_SCRIPT

    out = runs_dir()
    out.mkdir(parents=True, exist_ok=True)
    script = out.parent / "train_ddp.py"
    script.write_text(RANK_SCRIPT)
    ran = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         "2", str(script), str(out), "gpt2", "4"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
        capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr[-3000:]
    seen = [json.loads((out / f"seen{r}.json").read_text()) for r in range(2)]
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(out / "ddp.rank1.jsonl"), "")))
    with qtbot.waitSignal(win.record_shown, timeout=WAIT_MS):
        _menu_action(win, "File", "Open report or journal…").trigger()
    (trial,) = win.record.trials
    _, loss = win.charts.curve_data("loss", trial.precision)
    assert loss == pytest.approx([(a + b) / 2 for a, b in zip(seen[0]["loss"],
                                                              seen[1]["loss"])])
    _, lr = win.charts.curve_data("learning_rate", trial.precision)
    assert lr == pytest.approx(seen[0]["lr"], rel=1e-12)
    ranks = win.compare_view.ranks
    assert ranks.bars["median step ms"] == pytest.approx(
        [r.median_step_ms for r in trial.ranks])
    assert len(ranks.bars["median step ms"]) == 2
    # History: one entry for the two rank journals, opened merged, deleted whole
    view = win.history_view
    view.refresh()
    problems = [view.tree.topLevelItem(i).toolTip(0)
                for i in range(view.tree.topLevelItemCount())]
    # each journal starts with its run (a monitor sample never lands before it)
    assert view.run_ids() == [seen[0]["run_id"]], problems
    with qtbot.waitSignal(win.record_shown, timeout=WAIT_MS):
        view.open_run(seen[0]["run_id"])
    assert [r.rank for r in win.record.trials[0].ranks] == [0, 1]
    view.delete_run(seen[0]["run_id"])
    assert not list(out.glob("*.jsonl")) and view.run_ids() == []
