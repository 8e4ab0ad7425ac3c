"""Per-rank memory bars and the rank spread in Compare, for a report opened from File > Open."""

import dataclasses

import pytest
from PySide6.QtWidgets import QFileDialog

from engine.core.events import DistributedSummary, RankMemory, RankResult
from engine.report.json_io import write_json
from gui.main_window import MainWindow
from tests.engine.sample_record import make_record

MIB = 2**20


def _memory(shard: int, gathered: int | None, buckets: int | None) -> RankMemory:
    parts = dict(sharded_params_bytes=shard, unsharded_params_bytes=gathered,
                 grads_bytes=shard // 2, optimizer_bytes=2 * shard, activations_bytes=3 * MIB,
                 comm_buffers_bytes=buckets)
    return RankMemory(**parts, total_bytes=sum(v for v in parts.values() if v),
                      total_method="sum of the categories")


def _distributed_record():
    record = make_record()
    fsdp = [RankResult(rank=r, local_rank=r, host="h", pid=100 + r, status="ok",
                       memory=_memory((5 + r) * MIB, 2 * MIB, None),
                       predicted_memory=_memory(5 * MIB, 2 * MIB, None),
                       median_step_ms=100.0 + 10 * r) for r in (0, 1)]
    failed = [RankResult(rank=0, local_rank=0, host="h", pid=1, status="stopped"),
              RankResult(rank=1, local_rank=1, host="h", pid=2, status="oom",
                         reason="rank 1 was killed")]
    summary = DistributedSummary(strategy="fsdp2", world_size=2, nproc_per_node=2,
                                 backend="gloo", sharded="all", collectives={},
                                 slowest_rank=1, step_spread_pct=10.0)
    trials = list(record.trials)
    trials[0] = dataclasses.replace(trials[0], ranks=fsdp, distributed=summary)
    trials[1] = dataclasses.replace(trials[1], ranks=failed,
                                    distributed=dataclasses.replace(summary, step_spread_pct=None))
    record.trials = trials
    return record


@pytest.fixture
def window(qtbot):
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    return win


def _open_from_menu(qtbot, window, monkeypatch, path) -> None:
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(path), ""))
    action = next(a for m in window.menuBar().actions() for a in m.menu().actions()
                  if a.text().startswith("&Open report or journal"))
    with qtbot.waitSignal(window.record_shown, timeout=60_000):
        action.trigger()


def test_ranks_show_as_bars_beside_the_prediction(qtbot, window, monkeypatch, tmp_path):
    record = _distributed_record()
    path = write_json(record, tmp_path / "dist.json")
    _open_from_menu(qtbot, window, monkeypatch, path)
    view = window.compare_view.ranks
    window.tabs.setCurrentWidget(window.compare_view)
    assert view.isVisible()
    # four rank slots: two measured fsdp ranks, then the failed trial's two ranks
    assert view.bars["parameters (shard)"] == [5.0, 6.0]
    assert view.bars["all-gathered parameters"] == [2.0, 2.0]
    assert view.bars["optimizer state"] == [10.0, 12.0]
    assert view.bars["gradient buckets"] == []  # FSDP2 has none: no bar, not a zero
    # predicted: 5 shard + 2 gathered + 2.5 grads + 10 optimizer + 3 activations MiB
    assert view.bars["predicted total"] == [22.5, 22.5]
    assert view.bars["median step ms"] == [100.0, 110.0]
    assert "slowest rank 1, spread 10.0%" in view.title.text()


def test_a_run_without_ranks_hides_the_rank_view(qtbot, window, monkeypatch, tmp_path):
    path = write_json(make_record(), tmp_path / "single.json")
    _open_from_menu(qtbot, window, monkeypatch, path)
    window.tabs.setCurrentWidget(window.compare_view)
    assert not window.compare_view.ranks.isVisible()


def test_a_distributed_run_from_the_window_shows_its_ranks(qtbot, window):
    from engine.core.config import RunConfig

    config = RunConfig(model="tiny", precisions=("fp32@bf16",), batch_size=1, seq_len=16,
                       steps=2, warmup=0, device="cpu", strategy="ddp", nproc_per_node=2)
    with qtbot.waitSignal(window.record_shown, timeout=600_000) as blocker:
        assert window.start_run(config)
    record = blocker.args[0]
    trial = record.trial("fp32@bf16")
    assert trial.status == "ok", trial.reason
    window.tabs.setCurrentWidget(window.compare_view)
    view = window.compare_view.ranks
    assert view.isVisible()
    assert view.bars["parameters (shard)"] == [r.memory.sharded_params_bytes / MIB
                                               for r in trial.ranks]
    assert len(view.bars["median step ms"]) == 2
