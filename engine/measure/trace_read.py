"""A Chrome trace file read as a stream, checked event by event (``main.py trace FILE``).

``json.load`` of a torch.profiler trace holds every event as Python objects, about eight
times the file in memory (4.5 GB for a 524 MB trace), and a gzip that expands without
end or a device that reads without end (``/dev/zero``) would exhaust memory first. The
trace is decoded here one event at a time (the stdlib's ``raw_decode``: no streaming JSON
library is a dependency), and only what the kernel analysis reads is kept: the complete
("X") events of the CPU ops, the runtime launches and the device work, with the few
``args`` it uses. What one event may hold and what the whole file may expand to are capped.

Every event kept is checked for the shape the analysis needs; one that fails is refused in
one line, naming the event, since shares computed from a NaN or a negative duration would
be numbers nobody can trust.
"""

from __future__ import annotations

import codecs
import gzip
import json
import math
import re
from pathlib import Path

from engine.core.file_kind import open_to_read

MAX_TRACE_BYTES = 2**30  # the JSON text, after gzip: a trace of up to 1 GiB is read
MAX_EVENT_BYTES = 4 * 2**20  # one event's JSON: far above a kernel's name or a foreach op's
_CHUNK = 2**20
# the Chrome trace categories torch.profiler writes: host ops, runtime launches, device work
CPU_CATS = ("cpu_op", "user_annotation")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_KEPT_CATS = CPU_CATS + RUNTIME_CATS + DEVICE_CATS
_KEPT_ARGS = ("Input type", "Input Dims", "External id", "correlation")
MAX_EVENTS = 8_000_000  # about three times a real 1 GiB trace's: each costs Python time
_SPACE = re.compile(r"[ \t\r\n]*")
_RECORD = "record it again with prof.export_chrome_trace('trace.json')"


def read_trace(path: Path) -> dict:
    """``{"traceEvents": [...]}``: the trace's analysed events, checked. Every failure is one
    ValueError that says what to do."""
    with open_to_read(path, "trace", "a Chrome trace .json file") as fh:
        gz = fh.read(2) == b"\x1f\x8b"  # tensorboard_trace_handler's .json.gz
        fh.seek(0)
        reader = _Reader(path, gzip.GzipFile(fileobj=fh) if gz else fh)
        try:
            events = reader.events()
        except (OSError, EOFError, gzip.BadGzipFile):
            raise ValueError(f"{path} is a damaged gzip file: {_RECORD}") from None
    return {"traceEvents": events}


class _Reader:
    """Walks the top level of a trace (``{"traceEvents": [...], ...}`` or the bare list),
    decoding each event from a buffer refilled a chunk at a time."""

    def __init__(self, path: Path, stream) -> None:
        self.path, self._stream = path, stream
        self._text = codecs.getincrementaldecoder("utf-8")()
        self._decoder = json.JSONDecoder()
        self._buf, self._pos, self._read, self._eof = "", 0, 0, False

    def events(self) -> list[dict]:
        first = self._char()
        if first == "[":
            return self._array()
        if first != "{":
            raise self._not_json()
        self._pos += 1
        events = None
        while (c := self._char()) != "}":
            key = self._value()
            if not isinstance(key, str) or self._char() != ":":
                raise self._not_json()
            self._pos += 1
            if key == "traceEvents" and self._char() == "[":
                events = self._array()
            else:
                self._value()  # deviceProperties, schemaVersion, ...: not analysed
            if (c := self._char()) == ",":
                self._pos += 1
            elif c != "}":
                raise self._not_json()
        if events is None:
            raise ValueError(f"{self.path} has no traceEvents list: it is not a torch.profiler "
                             f"Chrome trace; {_RECORD}")
        return events

    def _array(self) -> list[dict]:
        self._pos += 1
        kept: list[dict] = []
        index = 0
        while self._char() != "]":
            if index == MAX_EVENTS:
                raise ValueError(f"{self.path} holds over {MAX_EVENTS:,} events: a trace this "
                                 "large is refused; profile fewer steps (torch.profiler's "
                                 "schedule with active=1)")
            event = _checked(self.path, index, self._value())
            if event is not None:
                kept.append(event)
            index += 1
            if (c := self._char()) == ",":
                self._pos += 1
            elif c != "]":
                raise self._not_json()
        self._pos += 1
        return kept

    def _value(self):
        """The next JSON value; one cut by the buffer's end is decoded again with more."""
        while True:
            self._char()
            try:
                value, end = self._decoder.raw_decode(self._buf, self._pos)
                if end - self._pos > MAX_EVENT_BYTES:
                    raise self._too_large()
                if end < len(self._buf) or self._eof:  # a number may go on in the next chunk
                    self._pos = end
                    return value
            except json.JSONDecodeError:
                if self._eof:
                    raise self._not_json() from None
            except RecursionError:
                raise self._not_json() from None
            if len(self._buf) - self._pos > MAX_EVENT_BYTES:
                raise self._too_large()
            self._more()

    def _char(self) -> str:
        """The next character that is not white space ("" at the end), refilling."""
        while True:
            self._pos = _SPACE.match(self._buf, self._pos).end()
            if self._pos < len(self._buf) or self._eof:
                return self._buf[self._pos:self._pos + 1]
            self._more()

    def _more(self) -> None:
        data = self._stream.read(_CHUNK)
        self._read += len(data)
        if self._read > MAX_TRACE_BYTES:
            raise ValueError(f"{self.path} holds over {MAX_TRACE_BYTES // 2**30} GiB of JSON "
                             "(after gzip): a trace this large is refused; profile fewer "
                             "steps (torch.profiler's schedule with active=1)")
        try:
            text = self._text.decode(data, final=not data)
        except UnicodeDecodeError:
            raise ValueError(f"{self.path} is not a text file: {_RECORD}") from None
        self._buf = self._buf[self._pos:] + text
        self._pos = 0
        self._eof = not data

    def _too_large(self) -> ValueError:
        return ValueError(f"{self.path} holds a value over {MAX_EVENT_BYTES // 2**20} MiB of "
                          f"JSON (or damaged JSON): not a torch.profiler trace; {_RECORD}")

    def _not_json(self) -> ValueError:
        return ValueError(f"{self.path} is not JSON: pick a Chrome trace written by "
                          "torch.profiler (prof.export_chrome_trace('trace.json'))")


def _checked(path: Path, index: int, e) -> dict | None:
    """The event as the analysis reads it (only the fields it uses), None for one it never
    reads (metadata, flows, instants); a ValueError for one it would misread."""
    if not isinstance(e, dict):
        raise _damaged(path, index, f"is {_kind(e)}, not an object")
    if e.get("ph") != "X" or e.get("cat") not in _KEPT_CATS:
        return None
    if not isinstance(e.get("name"), str):
        raise _damaged(path, index, f"has a name that is {_kind(e.get('name'))}, not text")
    for key in ("ts", "dur"):
        value = e.get(key)
        if value is None:
            raise _damaged(path, index, f"({e['name'][:60]}) has no '{key}'")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _damaged(path, index, f"({e['name'][:60]}) has a '{key}' that is "
                                        f"{_kind(value)}, not a number")
        if not math.isfinite(value) or value < 0:
            raise _damaged(path, index, f"({e['name'][:60]}) has '{key}' {value}: times in a "
                                        "trace are finite and not negative")
    args = e.get("args", {})
    if not isinstance(args, dict):
        raise _damaged(path, index, f"({e['name'][:60]}) has args that are {_kind(args)}, "
                                    "not an object")
    for key in ("pid", "tid"):
        if not isinstance(e.get(key), int | str | None):
            raise _damaged(path, index, f"({e['name'][:60]}) has a '{key}' that is "
                                        f"{_kind(e.get(key))}")
    kept = {k: args[k] for k in _KEPT_ARGS if k in args}
    for key in ("External id", "correlation"):
        if key in kept and (isinstance(kept[key], bool) or not isinstance(kept[key], int)):
            raise _damaged(path, index, f"({e['name'][:60]}) has an '{key}' that is "
                                        f"{_kind(kept[key])}, not a whole number")
    types = kept.get("Input type", [])
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise _damaged(path, index, f"({e['name'][:60]}) has an 'Input type' that is not a "
                                    "list of type names")
    if not isinstance(kept.get("Input Dims", []), list):
        raise _damaged(path, index, f"({e['name'][:60]}) has 'Input Dims' that are not a list")
    return {"ph": "X", "cat": e["cat"], "name": e["name"], "pid": e.get("pid"),
            "tid": e.get("tid"), "ts": e["ts"], "dur": e["dur"], "args": kept}


def _kind(value) -> str:
    return {dict: "an object", list: "a list", str: "text", bool: "true/false",
            type(None): "null"}.get(type(value), "a number")


def _damaged(path: Path, index: int, what: str) -> ValueError:
    return ValueError(f"{path}: event {index} of traceEvents {what}: the trace is damaged or "
                      f"not torch.profiler's; {_RECORD}")
