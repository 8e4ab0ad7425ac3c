"""History tab: runs stored by the window, reopened, deleted and compared across runs."""

import pytest

from engine.core.config import RunConfig
from engine.run.runner import Runner
from gui.history import HistoryStore
from gui.main_window import MainWindow


@pytest.fixture(scope="module")
def two_runs():
    """Two real runs of the engine (tiny preset, CPU, inline): fp32+bf16, then fp32."""
    config = RunConfig(model="tiny", precisions=("fp32", "bf16"), batch_size=1, seq_len=16,
                       steps=2, warmup=0, device="cpu", isolation="inline")
    first = Runner(config).run()
    second = Runner(config.replace(precisions=("fp32",))).run()
    return first, second


@pytest.fixture
def window(qtbot, two_runs):
    store = HistoryStore()
    for record in two_runs:
        store.add(record)
    win = MainWindow(history=store)
    qtbot.addWidget(win)
    return win


def test_history_lists_runs_with_their_trials(window, two_runs):
    view = window.history_view
    assert sorted(view.run_ids()) == sorted(r.run_id for r in two_runs)
    first = two_runs[0]
    item = view.tree.topLevelItem(view.run_ids().index(first.run_id))
    assert [item.child(i).text(0) for i in range(item.childCount())] == ["fp32", "bf16"]
    assert item.text(2) == "tiny" and item.text(5) == "ok"


def test_reopen_shows_the_run_in_every_view(qtbot, window, two_runs):
    first = two_runs[0]
    with qtbot.waitSignal(window.record_shown):
        window.history_view.open_run(first.run_id)
    assert window.record.run_id == first.run_id
    assert window.compare_view.proxy.rowCount() == 2
    assert window.trial_table.precisions() == ["fp32", "bf16"]
    assert window.charts.curve_points("loss", "bf16") == len(first.trial("bf16").steps)


def test_delete_removes_the_run(window, two_runs):
    first, second = two_runs
    window.history_view.delete_run(first.run_id)
    assert window.history_view.run_ids() == [second.run_id]
    assert [e.id for e in window.history.list()] == [second.run_id]


def test_trials_from_two_runs_are_compared_side_by_side(qtbot, window, two_runs):
    first, second = two_runs
    view = window.history_view
    view.set_checked(first.run_id, "bf16")
    view.set_checked(second.run_id, "fp32")
    with qtbot.waitSignal(view.compare_requested):
        view.compare_checked()
    assert window.tabs.currentWidget() is window.compare_view
    proxy = window.compare_view.proxy
    labels = {proxy.index(r, 0).data() for r in range(proxy.rowCount())}
    assert labels == {f"{first.run_id}/bf16", f"{second.run_id}/fp32"}
    assert "2 run(s)" in window.compare_view.note.text()


def test_compare_without_ticks_says_what_to_do(window):
    window.history_view.compare_checked()
    assert "Tick at least one trial" in window.history_view.message.text()


def _tick_with_keyboard(view, run_id: str, precision: str) -> None:
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest

    run = view.tree.topLevelItem(view.run_ids().index(run_id))
    run.setExpanded(True)
    child = next(run.child(i) for i in range(run.childCount())
                 if run.child(i).text(0) == precision)
    view.tree.setCurrentItem(child)
    view.tree.setFocus()
    QTest.keyClick(view.tree, Qt.Key.Key_Space)
    assert child.checkState(0) == Qt.CheckState.Checked


def _press(view, text: str) -> None:
    from PySide6.QtWidgets import QPushButton

    from tests.gui.clicks import click

    click(next(b for b in view.findChildren(QPushButton) if b.text() == text))


def test_the_ticked_fp32_trial_is_the_baseline_across_runs(qtbot, window, two_runs):
    first, second = two_runs
    window.show()
    window.tabs.setCurrentWidget(window.history_view)
    view = window.history_view
    _tick_with_keyboard(view, first.run_id, "bf16")
    _tick_with_keyboard(view, second.run_id, "fp32")
    with qtbot.waitSignal(view.compare_requested):
        _press(view, "Compare ticked trials")
    proxy = window.compare_view.proxy
    headers = [proxy.headerData(c, Qt_horizontal()) for c in range(proxy.columnCount())]
    column = headers.index("Speed-up vs fp32")
    shown = {proxy.index(r, 0).data(): proxy.index(r, column).data()
             for r in range(proxy.rowCount())}
    expected = (second.trial("fp32").summary.median_step_ms
                / first.trial("bf16").summary.median_step_ms)
    assert shown[f"{first.run_id}/bf16"] == f"{expected:.2f}x", shown
    assert f"Baseline: {second.run_id}/fp32" in window.compare_view.note.text()
    assert "different models" not in window.compare_view.note.text()


def test_trials_of_different_models_are_compared_with_a_warning(qtbot, two_runs):
    import dataclasses

    first, second = two_runs
    other = dataclasses.replace(second, run_id="othermodel",
                                config={**second.config, "model": "gpt2"})
    note = _compare_fp32_of(qtbot, first, other)
    assert "trained different models (" in note and "tiny" in note and "gpt2" in note
    assert "several fp32 trials are ticked" in note


def _compare_fp32_of(qtbot, first, other) -> str:
    """Both runs in History, their fp32 trials ticked and compared: the Compare tab's note."""
    store = HistoryStore()
    for record in (first, other):
        store.add(record)
    window = MainWindow(history=store)
    qtbot.addWidget(window)
    window.show()
    window.tabs.setCurrentWidget(window.history_view)
    view = window.history_view
    _tick_with_keyboard(view, first.run_id, "fp32")
    _tick_with_keyboard(view, other.run_id, "fp32")
    with qtbot.waitSignal(view.compare_requested):
        _press(view, "Compare ticked trials")
    return window.compare_view.note.text()


def Qt_horizontal():  # noqa: N802 (reads as the Qt enum it returns)
    from PySide6.QtCore import Qt

    return Qt.Orientation.Horizontal


def test_trials_on_different_data_are_compared_with_a_warning(qtbot, two_runs):
    import dataclasses

    from engine.core.events import TrainingData

    first, second = two_runs
    assert first.data.source == "pydoc_data.topics (CPython docs)"  # the default
    random = TrainingData("uniform random tokens", None, None, None, None, "by seed 0")
    other = dataclasses.replace(second, run_id="otherdata", data=random)
    note = _compare_fp32_of(qtbot, first, other)
    assert "trained on different data (" in note and "not comparable" in note
    assert "pydoc_data.topics (CPython docs)" in note and "uniform random tokens" in note
