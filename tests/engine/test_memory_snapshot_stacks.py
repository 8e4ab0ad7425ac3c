"""The CUDA allocator snapshot of a profiled step asks torch for Python stacks only: the
C++ stacks (the default "all") cost seconds per step to symbolise and say nothing a user
of AmpScope can act on. Tested at the call in ``profile_step`` with torch's CUDA entry
points recorded, since no GPU runs here."""

from __future__ import annotations

import torch

from engine.measure import kernels


def test_the_profiled_step_records_python_stacks_only(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: 1234)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                        lambda *a, **k: calls.append(("record", a, k)))
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot",
                        lambda path: calls.append(("dump", (path,), {})))
    snapshot = str(tmp_path / "step.pickle")
    result = kernels.profile_step(lambda: torch.ones(8).sum(), torch.device("cuda"), 0,
                                  memory_snapshot_file=snapshot)
    started = [k for name, _, k in calls if name == "record" and k.get("enabled", "all")]
    assert started and all(k.get("stacks") == "python" for k in started), calls
    assert ("dump", (snapshot,), {}) in calls
    assert calls[-1][0] == "record" and calls[-1][2] == {"enabled": None}  # turned off after
    assert result.memory_snapshot_file == snapshot and result.peak_memory_bytes == 1234
