"""The kernel table on the torch people have: torch 2.11's ``FunctionEvent`` has no
``input_dtypes`` nor ``linked_correlation_id`` (every Runner run on the H200 lost its table).

The events here are real (a CPU profile of this torch, the H200's Kineto trace); the
older torch is the same events seen through ``Torch211Event``, which has neither
attribute, as that torch gives them. The table from either must be the same. Under an
older torch in CI the ordinary profile tests take the other branch for real.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch

from engine.measure.kernels import (
    UNATTRIBUTED,
    _calls_from,
    analyse,
    chrome_trace_events,
    kineto_dtypes,
)

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "tests" / "data" / "h200-2026-11-27" / "trace" / \
    "gpt2-bf16-amp-b4x512.trace.json.gz"


class Torch211Event:
    """A profiler event without the attributes in ``hidden``, its tree seen the same way."""

    def __init__(self, event, hidden: tuple[str, ...], seen: dict):
        self._event, self._hidden, self._seen = event, hidden, seen

    @classmethod
    def wrap(cls, event, hidden, seen):
        if event is None:
            return None
        if id(event) not in seen:
            seen[id(event)] = cls(event, hidden, seen)
        return seen[id(event)]

    def __getattr__(self, name):
        if name in self._hidden:
            raise AttributeError(f"FunctionEvent has no attribute {name!r}")
        value = getattr(self._event, name)
        if name == "cpu_parent":
            return self.wrap(value, self._hidden, self._seen)
        if name == "cpu_children":
            return [self.wrap(c, self._hidden, self._seen) for c in value]
        return value


def as_torch_211(events, hidden=("input_dtypes", "linked_correlation_id")):
    seen: dict = {}
    return [Torch211Event.wrap(e, hidden, seen) for e in events]


def table_of(events, device_kind, dtypes_by_id=None):
    calls, step_us, spans = _calls_from(events, dtypes_by_id)
    return analyse(calls, device_kind, step_us, spans)


def _table(ps):
    return (sorted((o.op, o.dtype, o.category, o.calls, round(o.self_ms, 6)) for o in ps.ops),
            sorted((k.name, k.op, k.dtype, k.calls, round(k.ms, 6)) for k in ps.kernels),
            {c: round(v, 6) for c, v in ps.category_ms.items()},
            ps.matmul_share_by_dtype, ps.idle_gap_ms)


def test_a_cpu_profile_without_input_dtypes_gives_the_same_table():
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters())
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with record_function("ampscope:step"):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(torch.randn(8, 16)).float().pow(2).mean()
            loss.backward()
            opt.step()
    events = prof.events()
    newest = table_of(events, "cpu") if all(hasattr(e, "input_dtypes") for e in events) \
        else None
    oldest = table_of(as_torch_211(events), "cpu", kineto_dtypes(prof))
    # the profiler's own records hold the dtypes: autocast's matmuls ran in bf16
    assert "bfloat16" in oldest.matmul_share_by_dtype
    assert {o.dtype for o in oldest.ops} - {"-"}
    if newest is not None:  # this torch has the attribute: both branches agree
        ops = sorted((o.op, o.dtype, o.category, o.calls) for o in newest.ops)
        assert ops == sorted((o.op, o.dtype, o.category, o.calls) for o in oldest.ops)
        assert newest.matmul_share_by_dtype.keys() == oldest.matmul_share_by_dtype.keys()


def test_the_h200_trace_without_kernel_links_gives_the_same_table(tmp_path):
    """Kernels attributed by the ops' own kernel lists equal those attributed by link."""
    path = tmp_path / "step.trace.json"
    path.write_bytes(gzip.decompress(TRACE.read_bytes()))
    events = chrome_trace_events(str(path))
    # leave out the copy ops: their kernels then have no op (as a launch outside any op)
    events = [e for e in events if e.name != "aten::copy_"]
    linked = table_of(events, "cuda")
    unlinked = table_of(as_torch_211(events, ("linked_correlation_id",)), "cuda")
    assert _table(unlinked) == _table(linked)
    assert linked.category_ms[UNATTRIBUTED] > 0
    assert linked.kernels and linked.matmul_share_by_dtype.get("bfloat16", 0) > 0


@pytest.mark.parametrize("hidden", [("input_dtypes",), ("input_dtypes", "linked_correlation_id")])
def test_events_without_dtypes_and_no_records_say_unknown_not_a_guess(hidden, tmp_path):
    path = tmp_path / "step.trace.json"
    path.write_bytes(gzip.decompress(TRACE.read_bytes()))
    ps = table_of(as_torch_211(chrome_trace_events(str(path)), hidden), "cuda")
    assert set(ps.matmul_share_by_dtype) == {"unknown"}
    assert {o.dtype for o in ps.ops} == {"-"}
