"""File > Watch run: the window follows a journal while another process appends to it."""

import subprocess
import sys
import textwrap
from pathlib import Path

from PySide6.QtWidgets import QFileDialog

from engine.record.journal import read_journal
from gui.main_window import MainWindow

ROOT = Path(__file__).resolve().parents[2]
WAIT_MS = 120_000  # waits for the writer process, does not time it

# a writer in its own process: the events a user's run journals, one step every 50 ms,
# then it waits for the test's go-ahead before the run ends
WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from engine.core.events import (RunFinished, RunStarted, StepSample, TrialFinished,
                               TrialResult, TrialStarted, MonitorSample)
    from engine.record.journal import JournalWriter
    journal, go = Path(sys.argv[1]), Path(sys.argv[2])
    w = JournalWriter(journal)
    w.write(RunStarted("watchgui01", {"model": "users-model", "precisions": ["bf16-amp"],
                                      "source": "user-loop"}, {}, time.time()))
    w.write(TrialStarted("bf16-amp", 0, 1, time.time()))
    steps = []
    for i in range(6):
        s = StepSample("bf16-amp", i, i == 0, 5.0 - i / 4, 40.0, 800.0, None, None, None,
                       None, None, False, 1.5, time.time(), tokens=32)
        steps.append(s)
        w.write(s)
        w.write(MonitorSample(time.time(), "host", cpu_pct=50.0, host_rss_bytes=2**28))
        time.sleep(0.05)
    while not go.exists():
        time.sleep(0.05)
    w.write(TrialFinished(TrialResult("bf16-amp", "ok", recipe="user loop", steps=steps,
                                      source="user-loop"), time.time()))
    w.write(RunFinished("ok", time.time()))
    w.close()
""")


def _menu_action(win: MainWindow, menu: str, text: str):
    bar = win.menuBar()
    top = next(a for a in bar.actions() if a.text().replace("&", "") == menu)
    return next(a for a in top.menu().actions() if a.text().replace("&", "") == text)


def test_watch_run_follows_a_journal_another_process_writes(qtbot, tmp_path, monkeypatch):
    journal, go = tmp_path / "watched.jsonl", tmp_path / "go"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    writer = subprocess.Popen([sys.executable, str(script), str(journal), str(go)],
                              env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    asked = []

    def pick(parent, caption, folder, filters):
        asked.append(filters)
        return str(journal), filters

    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(pick))
    try:
        qtbot.waitUntil(journal.exists, timeout=WAIT_MS)
        _menu_action(win, "File", "Watch run…").trigger()
        assert "*.jsonl" in asked[0]
        # the steps appear while the writer is still running (it waits for "go")
        qtbot.waitUntil(lambda: win.charts.curve_points("loss", "bf16-amp") == 6,
                        timeout=WAIT_MS)
        assert writer.poll() is None
        assert win.record.status == "running"
        # the table follows at the redraw rate (every 100 ms), not at every event
        qtbot.waitUntil(lambda: "800" in win.trial_table.cell_text("bf16-amp", "Throughput"),
                        timeout=WAIT_MS)
        assert win.trial_table.cell_text("bf16-amp", "Status") == "running"
        # each redraw tick repaints a few changed charts: the others follow on later ticks
        qtbot.waitUntil(lambda: win.charts.curve_points("throughput", "bf16-amp") == 6,
                        timeout=WAIT_MS)
        go.touch()
        qtbot.waitUntil(lambda: win.record.status == "ok", timeout=WAIT_MS)
        assert writer.wait(timeout=60) == 0
    finally:
        writer.kill()
    record = win.record
    assert record.run_id == "watchgui01"
    assert [s.loss for s in record.steps("bf16-amp")] == [
        s.loss for s in read_journal(journal).trials[0].steps]
    # the watched run is in History and Compare like a profile run
    qtbot.waitUntil(lambda: "watchgui01" in win.history_view.run_ids(), timeout=WAIT_MS)
    assert win.record.trial("bf16-amp").source == "user-loop"


def test_watching_something_that_is_not_a_journal_says_so(qtbot, tmp_path, monkeypatch):
    win = MainWindow()
    qtbot.addWidget(win)
    notes = tmp_path / "notes.jsonl"
    notes.write_text("hello\n")
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a: (str(notes), "")))
    _menu_action(win, "File", "Watch run…").trigger()
    qtbot.waitUntil(lambda: "Stopped watching" in win.statusBar().currentMessage(),
                    timeout=WAIT_MS)
    assert "damaged" in win.statusBar().currentMessage()
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a: (str(tmp_path / "gone.jsonl"), "")))
    _menu_action(win, "File", "Watch run…").trigger()
    assert "journal not found" in win.statusBar().currentMessage()


def test_watching_a_cli_run_shows_its_form_and_never_says_the_users_run_was_cancelled(
        qtbot, tmp_path, monkeypatch):
    import os
    import signal

    data = Path(os.environ["AMPSCOPE_DATA_DIR"])  # the window's data folder (conftest)
    cli = subprocess.Popen(
        [sys.executable, "main.py", "profile", "--model", "tiny", "--precision", "fp32",
         "--batch-size", "2", "--seq-len", "24", "--steps", "5000", "--warmup", "1",
         "--device", "cpu", "--quiet"],
        cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    try:
        qtbot.waitUntil(lambda: any((data / "runs").glob("*.jsonl")), timeout=WAIT_MS)
        (journal,) = (data / "runs").glob("*.jsonl")
        monkeypatch.setattr(QFileDialog, "getOpenFileName",
                            staticmethod(lambda *a, **k: (str(journal), "")))
        _menu_action(win, "File", "Watch run…").trigger()
        qtbot.waitUntil(lambda: len(win.record.steps("fp32")) >= 3, timeout=WAIT_MS)
        # the form shows the watched run's settings, not the ones typed before
        values = win.config_panel.form_values()
        assert (values["model"], values["precisions"], values["batch_size"],
                values["seq_len"], values["steps"]) == ("tiny", ["fp32"], 2, 24, 5000)
        assert win.statusBar().currentMessage().startswith("fp32: ")  # its phases
        os.killpg(cli.pid, signal.SIGINT)  # the CLI's user stops it
        assert cli.wait(timeout=120) == 130
        qtbot.waitUntil(lambda: win.record.status == "cancelled", timeout=WAIT_MS)
    finally:
        if cli.poll() is None:
            cli.kill()
    message = win.statusBar().currentMessage()
    assert message.startswith(f"Watched run {win.record.run_id}: stopped by its own process")
    assert "Run cancelled" not in message
    assert win.run_button.isEnabled()
