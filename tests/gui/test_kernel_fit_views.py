"""The Kernels and Fit tabs on the real engine: tiny preset, CPU, inline trials."""

import json
import math

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QFileDialog

from gui.main_window import MainWindow

TIMEOUT_MS = 300_000  # generous: these wait for real trials, they do not time them
FORM = {"model": "tiny", "precisions": ["fp32", "bf16-amp"], "batch_size": 1, "seq_len": 16,
        "steps": 1, "warmup": 0, "device": "cpu", "isolation": "inline"}


@pytest.fixture
def window(qtbot):
    win = MainWindow()
    qtbot.addWidget(win)
    win.config_panel.set_values(FORM)
    win.show()
    return win


def _action(win: MainWindow, menu_title: str, text: str):
    menu = next(a.menu() for a in win.menuBar().actions() if a.text() == menu_title)
    return next(a for a in menu.actions() if a.text() == text)


def test_traced_run_from_the_menu_fills_the_kernels_tab(qtbot, window, tmp_path, monkeypatch):
    folder = tmp_path / "traces"
    folder.mkdir()
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(folder))
    with qtbot.waitSignal(window.record_shown, timeout=TIMEOUT_MS) as blocker:
        _action(window, "&Run", "Run with &kernel traces…").trigger()
    record = blocker.args[0]
    assert [t.status for t in record.trials] == ["ok", "ok"]
    for p in ("fp32", "bf16-amp"):
        events = json.loads((folder / f"{p}.trace.json").read_text())["traceEvents"]
        assert any(e.get("name") == "ampscope:step" for e in events)

    view = window.kernel_view
    window.tabs.setCurrentWidget(view)
    assert view.summary.rowCount() == 2
    assert "float32" in view.summary_text(0, "Matmul by dtype")
    assert "bfloat16" in view.summary_text(1, "Matmul by dtype")
    idle = view.summary.item(0, 7)
    assert idle.text() == "n/a" and "CPU run" in idle.toolTip()
    gpm = view.summary.item(1, 9)
    assert gpm.text() == "n/a" and "GPM needs Hopper" in gpm.toolTip()

    qtbot.keyClicks(view.precision, "bf16")  # the combo's keyboard search picks bf16-amp
    assert view.precision.currentText() == "bf16-amp"
    rows = {(view.ops.item(r, 0).text(), view.ops.item(r, 1).text())
            for r in range(view.ops.rowCount())}
    assert ("aten::mm", "bfloat16") in rows
    shares = [view.ops.item(r, 5).text() for r in range(view.ops.rowCount())]
    assert all(s.endswith("%") for s in shares)
    # most time first, and a click on a header sorts by its numbers
    ms = [float(view.ops.item(r, 4).text()) for r in range(view.ops.rowCount())]
    assert ms == sorted(ms, reverse=True)
    header = view.ops.horizontalHeader()
    qtbot.mouseClick(header.viewport(), Qt.MouseButton.LeftButton,
                     pos=header.rect().topLeft() + QPoint(header.sectionViewportPosition(3) + 5,
                                                          5))
    calls = [int(view.ops.item(r, 3).text()) for r in range(view.ops.rowCount())]
    assert calls in (sorted(calls), sorted(calls, reverse=True))


def test_fit_view_validates_the_budget_inline(qtbot, window):
    view = window.fit_view
    window.tabs.setCurrentWidget(view)
    qtbot.keyClicks(view.budget, "lots")
    assert not view.error_label.isHidden()
    assert "--memory-budget" in view.error_label.text()
    assert not view.find_button.isEnabled()
    view.budget.clear()
    assert view.error_label.isHidden() and view.find_button.isEnabled()
    # no budget on the CPU: the engine says so, inline, and nothing runs
    qtbot.mouseClick(view.find_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not view.error_label.isHidden(), timeout=TIMEOUT_MS)
    assert "memory budget is required" in view.error_label.text()
    assert view.results.rowCount() == 0


def test_fit_view_finds_a_batch_and_predicts_cards(qtbot, window):
    window.config_panel.set_values({**FORM, "precisions": ["fp32"]})
    view = window.fit_view
    window.tabs.setCurrentWidget(view)
    qtbot.keyClicks(view.budget, "1GiB")
    view.max_batch.setValue(2)
    with qtbot.waitSignal(view.worker.finished, timeout=TIMEOUT_MS):
        qtbot.mouseClick(view.find_button, Qt.MouseButton.LeftButton)
    budget, (result,) = view.last_results
    assert budget == 2**30
    assert view.cell(view.results, 0, "Batch") == "2"
    assert "bound" in view.cell(view.results, 0, "Note")
    assert view.cell(view.results, 0, "Memory") == f"{result.memory_bytes / 2**20:.1f} MiB"
    p1, p2 = result.probes
    slope = (p2.peak_bytes - p1.peak_bytes) / (p2.batch_size - p1.batch_size)
    fixed = p1.peak_bytes - slope * p1.batch_size
    # an H100 80GB as CUDA reports it: 81090 MiB (torch's printout), 79.2 GiB
    assert view.cell(view.cards, 0, "H100 80GB (79.2 GiB)") == str(
        math.floor((81090 * 2**20 - fixed) / slope))
    assert "PREDICTION" in view.cards_note.text()
    assert view.find_button.isEnabled()


def test_fit_view_says_the_budget_as_typed_and_the_card_notes_as_a_table(qtbot, window):
    window.config_panel.set_values({**FORM, "precisions": ["fp32"]})
    view = window.fit_view
    window.tabs.setCurrentWidget(view)
    qtbot.keyClicks(view.budget, "32mib")
    view.max_batch.setValue(2)
    with qtbot.waitSignal(view.worker.finished, timeout=TIMEOUT_MS):
        qtbot.mouseClick(view.find_button, Qt.MouseButton.LeftButton)
    budget, (result,) = view.last_results
    assert budget == 32 * 2**20
    assert view.status.text().startswith("Budget 32 MiB. Memory: ")
    assert view.card_notes.rowCount() == 1
    assert view.cell(view.card_notes, 0, "Precision") == "fp32"
    assert view.cell(view.card_notes, 0, "How the prediction was made") == result.cards_note
    assert result.cards_note not in view.cards_note.text()  # the label no longer holds it


def test_fit_view_shows_each_precision_as_it_ends_and_stops(qtbot, window):
    view = window.fit_view
    window.tabs.setCurrentWidget(view)
    qtbot.keyClicks(view.budget, "32MiB")
    view.max_batch.setValue(2)
    assert not view.stop_button.isEnabled()
    with qtbot.waitSignal(view.worker.result, timeout=TIMEOUT_MS) as first:
        qtbot.mouseClick(view.find_button, Qt.MouseButton.LeftButton)
    # fp32's row is there while bf16-amp is still being searched
    qtbot.waitUntil(lambda: view.results.rowCount() == 1, timeout=TIMEOUT_MS)
    assert view.worker.is_running() and view.stop_button.isEnabled()
    assert view.cell(view.results, 0, "Precision") == "fp32"
    assert view.cell(view.results, 0, "Batch") == str(first.args[0].batch_size)
    with qtbot.waitSignal(view.worker.errored, timeout=TIMEOUT_MS):
        qtbot.mouseClick(view.stop_button, Qt.MouseButton.LeftButton)
    assert view.status.text().startswith("Stopped: 1 precision(s) searched")
    assert view.results.rowCount() == 1 and view.cell(view.results, 0, "Precision") == "fp32"
    assert view.error_label.isHidden()
    assert view.find_button.isEnabled() and not view.stop_button.isEnabled()
