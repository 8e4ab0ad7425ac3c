"""``main.py trace FILE`` on files that are not what they claim, spawned as a user runs it:
each is refused in one line on stderr with exit 2 and no traceback, in bounded memory (a
gzip that expands past the cap, a device that reads without end) and without blocking (a
FIFO with no writer)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.measure.trace_read import MAX_EVENT_BYTES, MAX_TRACE_BYTES

ROOT = Path(__file__).resolve().parents[2]


def trace_cli(path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "main.py", "trace", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def _op(name="aten::mm", ts=10.0, dur=5.0, **extra) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts,
            "dur": dur, "args": {"External id": 1, "Input type": ["float", "float"],
                                 "Input Dims": [[4, 4], [4, 4]]}, **extra}


def _refused(run: subprocess.CompletedProcess, *fragments: str) -> None:
    assert run.returncode == 2, run.stderr
    assert run.stdout == "" and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    for fragment in fragments:
        assert fragment in run.stderr, run.stderr


def test_a_well_formed_trace_of_the_same_shape_is_answered(tmp_path):
    """The base every case below breaks: two ops on one thread, no step range; the shares
    are of the ops' wall time, 10 to 30 us."""
    path = tmp_path / "ok.json"
    path.write_text(json.dumps({"traceEvents": [_op(), _op("aten::add", ts=20.0, dur=10.0)]}))
    run = subprocess.run([sys.executable, "main.py", "trace", str(path), "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    wall_us = (20.0 + 10.0) - 10.0
    assert out["step_ms"] == pytest.approx(wall_us / 1e3)
    assert out["matmul_share"] == pytest.approx(5.0 / wall_us)
    assert out["elementwise_share"] == pytest.approx(10.0 / wall_us)


def _with(event) -> dict:
    return {"traceEvents": [_op(), event]}


@pytest.mark.parametrize(("trace", "fragments"), [
    ({"traceEvents": [_op(), 7]}, ["event 1", "is a number, not an object"]),
    ({"traceEvents": [_op(), [1, 2]]}, ["event 1", "is a list, not an object"]),
    ({"traceEvents": 12}, ["no traceEvents list"]),
    (_with(_op(name=5)), ["event 1", "name that is a number"]),
    (_with(_op(name=["aten::mm"])), ["event 1", "name that is a list"]),
    (_with({**_op(), "args": 3}), ["event 1", "args that are a number"]),
    (_with({**_op(), "args": [1]}), ["event 1", "args that are a list"]),
    (_with({k: v for k, v in _op().items() if k != "dur"}), ["event 1", "has no 'dur'"]),
    (_with(_op(dur=-130.9)), ["event 1", "'dur' -130.9", "not negative"]),
    (_with(_op(ts=-5.0)), ["event 1", "'ts' -5.0"]),
    (_with(_op(dur="5")), ["event 1", "'dur' that is text"]),
    (_with({**_op(), "args": {"External id": [3]}}), ["'External id' that is a list"]),
    (_with({**_op(), "args": {"Input type": [1, 2]}}), ["'Input type'"]),
])
def test_a_malformed_event_is_one_line(tmp_path, trace, fragments):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(trace))
    _refused(trace_cli(path), str(path), *fragments)


@pytest.mark.parametrize(("key", "token"), [("dur", "NaN"), ("dur", "Infinity"),
                                            ("ts", "-Infinity"), ("ts", "NaN")])
def test_a_time_that_is_not_finite_is_refused_never_a_nan_share(tmp_path, key, token):
    """Python's json writes and reads these bare tokens; a share computed from one was
    printed as nan% with exit 0."""
    path = tmp_path / "nan.json"
    text = json.dumps(_with(_op(**{key: 12345.678})))
    path.write_text(text.replace("12345.678", token))
    _refused(trace_cli(path), "event 1", f"'{key}'", "finite")


def test_a_gzip_that_expands_past_the_cap_is_refused(tmp_path):
    """A few MB on disk that expand past MAX_TRACE_BYTES: refused when the cap is reached,
    reading it a chunk at a time (never the whole text in memory)."""
    path = tmp_path / "bomb.json.gz"
    pad = {"ph": "M", "name": "process_name", "args": {"pad": " " * (MAX_EVENT_BYTES // 4)}}
    chunk = ("," + json.dumps(pad)).encode()
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(b'{"traceEvents": [' + json.dumps(_op()).encode())
        for _ in range(MAX_TRACE_BYTES // len(chunk) + 2):
            f.write(chunk)
        f.write(b"]}")
    assert path.stat().st_size < MAX_TRACE_BYTES / 100
    _refused(trace_cli(path), "over 1 GiB of JSON (after gzip)")


def test_one_event_past_its_cap_is_refused(tmp_path):
    path = tmp_path / "huge-event.json"
    path.write_text(json.dumps(_with(_op(name="x" * (MAX_EVENT_BYTES + 10)))))
    _refused(trace_cli(path), f"over {MAX_EVENT_BYTES // 2**20} MiB")


def test_a_fifo_with_no_writer_is_refused_at_once(tmp_path):
    """Opening it would block for ever: the kind is read with os.stat first."""
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    _refused(trace_cli(fifo), "is a named pipe (FIFO)", "pick a Chrome trace")


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_a_device_that_reads_without_end_is_refused():
    _refused(trace_cli("/dev/zero"), "/dev/zero is a character device")


def test_a_damaged_gzip_is_one_line(tmp_path):
    path = tmp_path / "cut.json.gz"
    path.write_bytes(gzip.compress(json.dumps(_with(_op())).encode())[:-20])
    _refused(trace_cli(path), "damaged gzip")
