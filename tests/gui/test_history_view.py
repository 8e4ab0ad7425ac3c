"""History tab: runs stored by the window, reopened, deleted and compared across runs."""

import pytest

from engine.config import RunConfig
from engine.runner import Runner
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
