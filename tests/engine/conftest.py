import pytest

from engine.core.quiet import quiet_libraries
from tests.engine.sync_guard import sync_guard  # noqa: F401 - a fixture for every engine test

quiet_libraries()


@pytest.fixture
def hub_offline(tmp_path, monkeypatch):
    """An empty hub cache with the hub unreachable, as on a machine with no network."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return tmp_path / "hf"


@pytest.fixture
def one_rank_group(tmp_path):
    """A gloo process group of one rank in this process: a rank's own code, without torchrun."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()
