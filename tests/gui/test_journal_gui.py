"""Run journals in the window: History lists interrupted runs, File > Open reads .jsonl."""

import json
import subprocess
import sys

import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QFileDialog, QPushButton

from engine.core.config import RunConfig
from engine.record.journal import journal_path, runs_dir
from engine.run.runner import Runner
from gui.main_window import MainWindow


def _interrupted_journal(steps_kept: int):
    """A real run's journal cut after ``steps_kept`` steps, as a SIGKILL would leave it."""
    config = RunConfig(model="tiny", precisions=("fp32", "bf16"), batch_size=1, seq_len=16,
                       steps=4, warmup=0, device="cpu", isolation="inline")
    runner = Runner(config)
    runner.run()
    path = runner.journal_path
    kept, steps = [], 0
    for line in path.read_text().splitlines():
        kept.append(line)
        if json.loads(line)["e"] == "step":
            steps += 1
            if steps == steps_kept:
                break
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # the writer was killed: its pid is no longer alive
    kept[0] = json.dumps({"e": "journal", "version": 1, "pid": gone.pid})
    path.write_text("\n".join(kept) + "\n" + '{"e":"mon","t":17')  # torn last line
    return runner.record.run_id, path


@pytest.fixture
def window(qtbot):
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    return win


def _button(widget, text: str) -> QPushButton:
    (button,) = [b for b in widget.findChildren(QPushButton) if b.text() == text]
    return button


def test_history_lists_an_interrupted_journal_and_opens_it(qtbot, window):
    run_id, path = _interrupted_journal(steps_kept=2)
    assert path.parent == runs_dir()
    view = window.history_view
    view.refresh()
    assert run_id in view.run_ids()
    item = view.tree.topLevelItem(view.run_ids().index(run_id))
    assert item.text(5) == "interrupted" and item.text(2) == "tiny"
    window.tabs.setCurrentWidget(view)
    view.tree.setCurrentItem(item)
    with qtbot.waitSignal(window.record_shown) as shown:
        QTest.mouseClick(_button(view, "Open"), Qt.MouseButton.LeftButton)
    record = shown.args[0]
    assert record.run_id == run_id and record.status == "interrupted"
    fp32 = record.trial("fp32")
    assert fp32.status == "cancelled" and [s.step for s in fp32.steps] == [0, 1]
    assert "interrupted" in window.statusBar().currentMessage()
    assert window.trial_table.precisions() == ["fp32"]


def test_a_finished_window_run_is_listed_once(qtbot, window):
    config = RunConfig(model="tiny", precisions=("fp32",), batch_size=1, seq_len=16, steps=2,
                       warmup=0, device="cpu", isolation="inline")
    with qtbot.waitSignal(window.record_shown, timeout=300_000) as shown:
        assert window.start_run(config)
    run_id = shown.args[0].run_id
    assert journal_path(run_id).is_file()  # journaled and in the database
    assert window.history_view.run_ids().count(run_id) == 1
    item = window.history_view.tree.topLevelItem(window.history_view.run_ids().index(run_id))
    assert item.text(5) == "ok"


def test_file_open_reads_a_journal(qtbot, window, monkeypatch):
    run_id, path = _interrupted_journal(steps_kept=3)
    asked = []

    def pick(parent, caption, folder, filters):
        asked.append(filters)
        return str(path), filters

    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(pick))
    (action,) = [a for a in window.menuBar().actions()[0].menu().actions()
                 if a.text().startswith("&Open")]
    with qtbot.waitSignal(window.record_shown) as shown:
        action.trigger()
    assert "*.jsonl" in asked[0]
    record = shown.args[0]
    assert record.run_id == run_id and len(record.trial("fp32").steps) == 3
    assert window.windowTitle().endswith(run_id)


def test_failed_trials_are_counted_in_the_status_bar(qtbot, window, monkeypatch):
    from engine.run import trial_setup

    real = trial_setup.load_model

    def flaky(model, recipe, *a, **k):
        if recipe.precision == "fp32":
            raise RuntimeError("driver fell over")
        return real(model, recipe, *a, **k)

    monkeypatch.setattr(trial_setup, "load_model", flaky)
    config = RunConfig(model="tiny", precisions=("fp32", "bf16"), batch_size=1, seq_len=16,
                       steps=1, warmup=0, device="cpu", isolation="inline")
    with qtbot.waitSignal(window.record_shown, timeout=300_000):
        assert window.start_run(config)
    assert "1 of 2 trials failed" in window.statusBar().currentMessage()


WINDOW_RUN = """
import sys
from PySide6.QtWidgets import QApplication
app = QApplication([])
from engine.core.config import RunConfig
from gui.main_window import MainWindow
from gui.signals import close_on_signals
window = MainWindow()
window.show()
close_on_signals(window)
window.start_run(RunConfig(model="tiny", precisions=("fp32", "bf16"), batch_size=1,
                           seq_len=16, steps=500, warmup=0, device="cpu"))
sys.exit(app.exec())
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_signal_to_the_window_stops_its_run_and_leaves_no_process(tmp_path, sig):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import psutil

    from engine.record.journal import read_journal

    data = tmp_path / "signal-data"
    env = dict(os.environ, AMPSCOPE_DATA_DIR=str(data), QT_QPA_PLATFORM="offscreen")
    proc = subprocess.Popen([sys.executable, "-c", WINDOW_RUN], env=env,
                            cwd=Path(__file__).resolve().parents[2])
    runs = data / "runs"
    while not any('"e":"step"' in p.read_text() for p in runs.glob("*.jsonl")):
        assert proc.poll() is None
        time.sleep(0.1)
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(getattr(signal, sig))
    assert proc.wait() == 0
    _, alive = psutil.wait_procs(children, timeout=30)
    assert children and alive == []
    (journal,) = runs.glob("*.jsonl")
    record = read_journal(journal)
    assert record.status == "cancelled"
    fp32 = record.trial("fp32")
    assert fp32.status == "cancelled" and fp32.steps and fp32.memory is not None
    assert record.trial("bf16").status == "cancelled"
