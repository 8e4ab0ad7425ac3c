import pytest

from engine.core.events import TrialResult
from engine.record.run_record import RunRecord
from gui.history import HistoryStore, data_dir


def _record(run_id: str, started: float, precisions=("fp32", "bf16")) -> RunRecord:
    return RunRecord(
        run_id=run_id,
        config={"model": "tiny", "precisions": list(precisions), "device": "cpu"},
        environment={"device": {"name": "Test CPU", "description": "CPU (Test CPU)"}},
        trials=[TrialResult(p, "ok", param_count=123) for p in precisions],
        status="ok",
        started_s=started,
        finished_s=started + 5,
    )


def test_database_goes_to_the_overridden_data_dir(tmp_path):
    store = HistoryStore()
    assert store.path.parent == data_dir() == tmp_path / "data"
    assert store.path.exists()


def test_add_list_load_delete():
    store = HistoryStore()
    store.add(_record("older", 100.0))
    store.add(_record("newer", 200.0, ("fp32",)))

    entries = store.list()
    assert [e.id for e in entries] == ["newer", "older"]
    older = entries[1]
    assert older.model == "tiny"
    assert older.precisions == ("fp32", "bf16")
    assert older.device == "CPU (Test CPU)"
    assert older.status == "ok"

    loaded = store.load("older")
    assert loaded.to_dict() == _record("older", 100.0).to_dict()

    store.delete("older")
    assert [e.id for e in store.list()] == ["newer"]
    with pytest.raises(KeyError, match="older"):
        store.load("older")


def test_adding_the_same_run_again_replaces_it():
    store = HistoryStore()
    store.add(_record("r", 1.0))
    store.add(_record("r", 1.0, ("bf16",)))
    assert [e.precisions for e in store.list()] == [("bf16",)]


def test_a_run_without_id_is_refused():
    with pytest.raises(ValueError, match="run_id"):
        HistoryStore().add(RunRecord())
