import pytest

from engine.quiet import quiet_libraries
from tests.engine.sync_guard import sync_guard  # noqa: F401 - a fixture for every engine test

quiet_libraries()


@pytest.fixture
def hub_offline(tmp_path, monkeypatch):
    """An empty hub cache with the hub unreachable, as on a machine with no network."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return tmp_path / "hf"
