import os

import pytest

# CI has 2 cores shared by the test process, its trial children and Qt: OpenMP worker
# threads that spin-wait for a busy core make tiny CPU steps ~20x slower. One intra-op
# thread keeps the suite quick; set before torch loads, and inherited by children.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_configure(config):
    """Every test (and every process it starts) keeps its data out of the user's folder.

    Runs write their journal to ``$AMPSCOPE_DATA_DIR/runs``; GUI tests point the
    variable at their own temporary folder on top of this. The measured matmul peak is
    cached in ``$AMPSCOPE_CACHE_DIR``: measured once per test session, then reused.
    """
    import tempfile

    for env, prefix in (("AMPSCOPE_DATA_DIR", "ampscope-test-data-"),
                        ("AMPSCOPE_CACHE_DIR", "ampscope-test-cache-")):
        folder = tempfile.mkdtemp(prefix=prefix)
        os.environ[env] = folder
        config.add_cleanup(lambda f=folder: __import__("shutil").rmtree(f, ignore_errors=True))


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need CUDA: skip them, saying why, on machines without it."""
    import pytest
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _avx512_bf16_cpu(monkeypatch):
    """Every in-process 4-bit layer believes the CPU has AVX512-BF16, and its conversion to
    bitsandbytes' CPU inference layout is refused: a test passes or fails the same on any
    CPU, and no measurement may switch a layer to kernels training would not run
    (engine/measure/untouched.py). Trials in child processes keep the CPU's own choice;
    tests/engine/test_observe.py runs each recipe inline."""
    import bitsandbytes.nn.modules as bnb_modules

    def refuse(*args, **kwargs):
        raise AssertionError("a 4-bit layer was converted to bitsandbytes' CPU inference "
                             "layout: later training steps would run other kernels")

    monkeypatch.setattr(bnb_modules, "has_avx512bf16", lambda: True)
    monkeypatch.setattr(bnb_modules, "_convert_weight_packed_for_cpu", refuse)
