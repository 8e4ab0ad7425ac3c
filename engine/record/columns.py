"""Steps and monitor samples of a read journal, kept as columns instead of one object each.

A long run journals hundreds of thousands of monitor polls and step lines; one frozen
dataclass per line cost ~1 KB each (a 100 MB journal needed over a gigabyte). ``Columns``
keeps the rows of one event class in two flat typed arrays (``array``: floats as doubles;
whole numbers, flags, interned texts and a bit mask of which fields are not ``None`` as
64-bit integers), and is still a read-only ``Sequence`` of the dataclass: ``rows[i]``,
iteration and ``len`` build the events on demand, so every consumer of
``record.steps(p)`` or ``record.monitor_samples`` keeps working. ``column(name)`` gives a
field as a numpy array (``NaN`` where ``None``) for the consumers that work on whole
series (report thinning).

``add_line`` is the journal reader's fast path: it stores a line whose every field has the
expected JSON type and lies inside the report schema's limits (``number_limits``), and
returns False for anything else, which the reader then checks with the full schema (and
its message naming the field).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from array import array
from collections.abc import Sequence
from operator import itemgetter, le

from engine.core.events import _hints
from engine.record.validate import MAX_NAME, MAX_TEXT, NAME_FIELDS, number_limits

if typing.TYPE_CHECKING:
    import numpy as np

_INT64 = (-(2**63), 2**63 - 1)
MAX_PLANS = 64  # line shapes planned as they come; beyond, a line's unknown keys are dropped


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    kind: type  # float, int, bool or str
    floats: bool  # stored in the float row (else in the integer row)
    slot: int
    bit: int
    required: bool
    low: float
    high: float  # the schema's limits (a string's: its length)


def _kind(hint) -> tuple[type, bool]:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    optional = len(args) < len(typing.get_args(hint))
    return (args[0] if optional else hint), optional


class _Layout:
    """Where each field of ``cls`` lives in a row."""

    def __init__(self, cls) -> None:
        self.cls = cls
        hints = _hints(cls)
        self.fields: list[_Field] = []
        n_float, n_int = 0, 1  # integer slot 0: the mask of fields that are not None
        for bit, f in enumerate(dataclasses.fields(cls)):
            kind, optional = _kind(hints[f.name])
            if kind not in (float, int, bool, str):
                raise TypeError(f"{cls.__name__}.{f.name}: no column for {kind}")
            # a journal leaves None fields out: only a field that cannot be None must be there
            required = not optional and (f.default is dataclasses.MISSING
                                         and f.default_factory is dataclasses.MISSING)
            low, high = _limits(f.name, kind)
            if kind is float:
                slot, n_float = n_float, n_float + 1
            else:
                slot, n_int = n_int, n_int + 1
            self.fields.append(_Field(f.name, kind, kind is float, slot, 1 << bit, required,
                                      low, high))
        self.width = (n_float, n_int)
        self.by_name = {f.name: f for f in self.fields}
        self.required = sum(f.bit for f in self.fields if f.required)


def _limits(name: str, kind: type) -> tuple[float, float]:
    if kind is str:
        return 0, MAX_NAME if name in NAME_FIELDS else MAX_TEXT
    low, high = -math.inf, math.inf
    for lo, hi, _ in number_limits(name):
        low, high = max(low, lo), min(high, hi)
    if kind is int:
        low, high = max(low, _INT64[0]), min(high, _INT64[1])
    return low, high


def _getter(positions: list[int]):
    """``itemgetter`` that always returns a tuple (it returns the item itself for one)."""
    if len(positions) == 1:
        only = positions[0]
        return lambda values: (values[only],)
    if not positions:
        return lambda values: ()
    return itemgetter(*positions)


_LAYOUTS: dict[type, _Layout] = {}
_PENDING = 2**16  # integers held in lists before they move to the arrays


def _layout(cls) -> _Layout:
    if cls not in _LAYOUTS:
        _LAYOUTS[cls] = _Layout(cls)
    return _LAYOUTS[cls]


_FLOAT, _INT, _BOOL, _STR = range(4)
_CODES = {float: _FLOAT, int: _INT, bool: _BOOL, str: _STR}


def line_keys(cls, renamed: dict[str, str] | None = None) -> dict[str, tuple]:
    """For ``add_line``: the fields of ``cls`` by the keys a journal line uses (``renamed``:
    key to field name), each as ``(kind code, slot, bit, low, high)`` (tuples unpack faster
    than attributes are read, and this runs for every field of every line)."""
    by_name = _layout(cls).by_name
    renamed = renamed or {name: name for name in by_name}
    return {key: (_CODES[f.kind], f.slot, f.bit, f.low, f.high)
            for key, f in ((key, by_name[name]) for key, name in renamed.items())}


class Columns(Sequence):
    """Rows of one event dataclass as columns (see the module's docstring)."""

    def __init__(self, cls, _shared=None, _length: int | None = None) -> None:
        self._layout = _layout(cls)
        if _shared is None:
            # floats, integers, rows on their way to those two (a list grows faster than
            # an array converts one value at a time), interned texts, their ids, and values
            # no column holds
            _shared = (array("d"), array("q"), [], [], [], {}, {})
        (self._floats, self._ints, self._pending_floats, self._pending_ints, self._texts,
         self._text_ids, self._extras) = _shared
        self._shared = _shared
        self._plans: dict[tuple, tuple | bool] = {}  # add_line's, by a line's shape
        self._frozen = _length is not None
        self._n = _length if _length is not None else (
            len(self._ints) + len(self._pending_ints)) // self._layout.width[1]

    # --- filling --------------------------------------------------------------------

    def _text_id(self, text: str) -> int:
        tid = self._text_ids.get(text)
        if tid is None:
            tid = self._text_ids[text] = len(self._texts)
            self._texts.append(text)
        return tid

    def add_line(self, line: dict, keys: dict[str, tuple]) -> bool:
        """Store one journal line if every field fits its column and the schema's limits;
        False (nothing stored) otherwise. ``keys`` comes from ``line_keys``; keys it does
        not name are ignored, as the schema ignores a newer writer's fields.

        Lines of one kind mostly share their keys and value types: the first such line
        builds a plan (where each value goes, which limits apply), and each line after it
        costs a few calls that loop in C (range checks by ``map``, rows by ``itemgetter``)."""
        values = tuple(line.values())
        shape = (tuple(line), tuple(map(type, values)))
        plan = self._plans.get(shape)
        if plan is None:
            if len(self._plans) >= MAX_PLANS:  # lines of ever new shapes (a key of their
                # own each): planned on the keys the schema knows, so the plans stay few
                known = {k: v for k, v in line.items() if k in keys}
                if len(known) < len(line):
                    return self.add_line(known, keys)
            plan = self._plans[shape] = self._plan(shape, keys)
        if plan is False:
            return False
        numbers, lows, highs, texts, floats, ints, mask = plan
        found = numbers(values)
        if not (all(map(le, lows, found)) and all(map(le, found, highs))):
            return False  # out of the schema's limits, or NaN: the full check decides
        ids = []
        for position, limit in texts:
            text = values[position]
            if len(text) > limit:
                return False
            ids.append(self._text_id(text))
        self._push(floats(values + (0.0,)), ints(values + (0, mask, *ids)))
        return True

    def _plan(self, shape: tuple, keys: dict[str, tuple]):
        """How lines of ``shape`` (their keys and value types) are stored; False for a
        shape the fast path does not take (a None, a text where a number goes...)."""
        n_float, n_int = self._layout.width
        n = len(shape[0])
        float_from = [n] * n_float  # position in (values + (0.0,)): n is the padding
        int_from = [n] * n_int  # position in (values + (0, mask, *text ids))
        int_from[0] = n + 1
        numbers, lows, highs, texts = [], [], [], []
        mask = 0
        for position, (key, kind) in enumerate(zip(*shape)):
            spec = keys.get(key)
            if spec is None:
                continue
            code, slot, bit, low, high = spec
            if bit & mask:
                return False  # a key twice under two names
            mask |= bit
            if code == _STR:
                if kind is not str:
                    return False
                texts.append((position, high))
                int_from[slot] = n + 1 + len(texts)
                continue
            if code == _BOOL and kind is not bool or code == _INT and kind is not int or \
                    code == _FLOAT and kind not in (float, int):
                return False
            (float_from if code == _FLOAT else int_from)[slot] = position
            if code != _BOOL:
                numbers.append(position)
                lows.append(low)
                highs.append(high)
        required = self._layout.required
        if mask & required != required:
            return False
        return (_getter(numbers), tuple(lows), tuple(highs), tuple(texts),
                _getter(float_from), _getter(int_from), mask)

    def append(self, event) -> None:
        """Store one event (one the schema accepted; values no column holds, such as an
        integer beyond 64 bits, are kept aside)."""
        if not isinstance(event, self._layout.cls):
            raise TypeError(f"expected {self._layout.cls.__name__}, got {type(event).__name__}")
        n_float, n_int = self._layout.width
        frow = [0.0] * n_float
        irow = [0] * n_int
        mask = 0
        extras = {}
        for f in self._layout.fields:
            value = getattr(event, f.name)
            if value is None:
                continue
            mask |= f.bit
            if f.kind is float:
                frow[f.slot] = value
            elif f.kind is str:
                irow[f.slot] = self._text_id(value)
            elif _INT64[0] <= value <= _INT64[1]:
                irow[f.slot] = value
            else:
                extras[f.name] = value
        irow[0] = mask
        if extras:
            self._extras[self._n] = extras
        self._push(frow, irow)

    def _push(self, frow: list, irow: list) -> None:
        if self._frozen:
            raise TypeError("a view of columns is read-only")
        self._pending_floats.extend(frow)
        self._pending_ints.extend(irow)
        self._n += 1
        if len(self._pending_ints) >= _PENDING:
            self._flush()

    def _flush(self) -> None:
        if self._pending_ints:
            self._floats.extend(array("d", self._pending_floats))
            self._ints.extend(array("q", self._pending_ints))
            self._pending_floats.clear()
            self._pending_ints.clear()

    def head(self, n: int) -> Columns:
        """A read-only view of the first ``n`` rows (rows are only ever added after them)."""
        self._flush()
        return Columns(self._layout.cls, self._shared, min(n, self._n))

    def __getstate__(self) -> dict:
        self._flush()
        return {**self.__dict__, "_plans": {}}  # plans hold lambdas; they rebuild as needed

    # --- reading --------------------------------------------------------------------

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._row(i) for i in range(*index.indices(self._n))]
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError("row out of range")
        return self._row(index)

    def __iter__(self):
        for i in range(self._n):
            yield self._row(i)

    def _row(self, i: int):
        self._flush()
        n_float, n_int = self._layout.width
        floats = self._floats[i * n_float:(i + 1) * n_float]
        ints = self._ints[i * n_int:(i + 1) * n_int]
        mask = ints[0]
        values = {}
        for f in self._layout.fields:
            if not mask & f.bit:
                values[f.name] = None
            elif f.floats:
                values[f.name] = floats[f.slot]
            elif f.kind is int:
                values[f.name] = ints[f.slot]
            elif f.kind is bool:
                values[f.name] = bool(ints[f.slot])
            else:
                values[f.name] = self._texts[ints[f.slot]]
        values.update(self._extras.get(i, ()))
        return self._layout.cls(**values)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None

    def __repr__(self) -> str:
        return f"<{len(self)} {self._layout.cls.__name__} rows as columns>"

    def column(self, name: str) -> np.ndarray:
        """One field of every row as float64 (``NaN`` where ``None``); a text field as the
        ids of ``texts(name)``, -1 where ``None``."""
        import numpy as np  # not at import: the window's start-up reads journals without it

        f = self._layout.by_name[name]
        n_float, n_int = self._layout.width
        n = self._n
        if n == 0:
            return np.empty(0)
        self._flush()
        # copies only: an array exporting its buffer could not grow any more
        ints = np.frombuffer(self._ints, dtype=np.int64, count=n * n_int).reshape(n, n_int)
        present = (ints[:, 0] & f.bit) != 0
        if f.floats:
            floats = np.frombuffer(self._floats, dtype=np.float64,
                                   count=n * n_float).reshape(n, n_float)
            values = floats[:, f.slot].copy()
        else:
            values = ints[:, f.slot].astype(np.float64)
        del ints
        values[~present] = -1 if f.kind is str else np.nan
        for i, extra in self._extras.items():
            if i < n and name in extra:
                values[i] = float(extra[name])
        return values

    def texts(self) -> list[str]:
        """The interned texts that ``column`` ids of a text field index."""
        return list(self._texts)
