"""The one check every report passes on its way in (a JSON file, a History entry).

The expected shape is read from the type hints of ``RunRecord`` and the event
dataclasses, so a field added to them is checked without an edit here. On top of the
types, plausibility limits follow the units in the field names (``_s``, ``_bytes``,
step counts), because a viewer trusts what passed: a NaN step time, 3e9 steps or a
year-30000 timestamp would break a chart, a progress bar or a date. Unknown keys are
ignored (a newer writer may add fields within the same schema version).

``validate_report`` raises ``ValueError`` naming the first bad field and what is wrong.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from functools import cache

from engine.core.config import MAX_STEPS  # any step index or step count
from engine.core.events import LostUpdateGroup, LostUpdates, MemoryTimeline, _hints
from engine.record.lab_results import (
    ActivationStats,
    Advice,
    DemoResult,
    FormatInfo,
    GradientStats,
    OpTrace,
)
from engine.record.run_record import SCHEMA_VERSION, RunRecord

MAX_DEPTH = 40  # nesting of free-form objects (config, environment, numerics)
MAX_TEXT = 100_000  # characters in one string (a reason, a note, a kernel name)
# names a view puts in a table cell, a legend or a title: a precision, a model, a run id
MAX_NAME = 4096  # a model may be a local folder's path
NAME_FIELDS = frozenset({"precision", "precisions", "status", "run_id", "model", "device",
                         "host", "strategy", "backend", "source", "level", "collective",
                         "dtype", "recipe", "support"})
MAX_MAGNITUDE = 1e30  # any other finite number: charts add and pad ranges, 1e308 overflows
# a loss, a gradient norm or a loss scale may legitimately reach fp32's largest value
# (a GradScaler grows to 2^127); above it, a chart's padded range overflows
MAX_FP32 = 3.4028234663852886e38
FP32_RANGE_FIELDS = frozenset({"loss", "final_loss", "grad_norm", "loss_scale",
                               "final_loss_scale", "init_scale"})
# counts, indices and depths that cannot be negative
NON_NEGATIVE = frozenset({"depth", "rank", "local_rank", "world_size", "round"})
MAX_EPOCH_S = 1e11  # absolute times are epoch seconds (year ~5000); relative ones are small
MAX_BYTES = 2**60
MAX_INT = 2**63
# measurements that may legitimately be non-finite: a loss or gradient norm that
# overflowed is kept as Infinity/NaN (docs/report-schema.md, "the null rule")
NONFINITE_FIELDS = frozenset({"loss", "final_loss", "grad_norm", "loss_before", "loss_after"})
# the numerics lab writes non-finite floats as these strings (engine.numerics.lab)
NONFINITE_TEXT = frozenset({"inf", "-inf", "nan"})
# RunRecord fields that are not part of the file
NOT_SERIALISED = frozenset({"live_steps", "repaired"})


class _Bad(ValueError):
    """A problem at a path; each container on the way up puts its key in front (cheap: the
    path is only built when something is wrong)."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.path: list[str | int] = []

    def __str__(self) -> str:
        where = ""
        for part in reversed(self.path):
            where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else part)
        return f"{where or 'the report'}: {self.problem}"


def _at(exc: _Bad, part: str | int) -> _Bad:
    exc.path.append(part)
    return exc



def _describe(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_time(name: str) -> bool:
    return name.endswith("_s") and not name.endswith("per_s")  # tokens_per_s is a rate


def _is_step_count(name: str) -> bool:
    return name in ("step", "steps", "warmup") or name.endswith("_steps") or name.startswith(
        "steps_")


@cache
def number_limits(name: str, numerics: bool = False) -> tuple[tuple[float, float, str], ...]:
    """``(low, high, problem)`` limits for a number by its field name: units and counts are
    in the names. The numerics lab's tables hold formats' own limits (fp32's 3.4e38), so no
    magnitude cap applies there."""
    limits = []
    if _is_time(name):
        limits.append((-MAX_EPOCH_S, MAX_EPOCH_S, "seconds is not a plausible time"))
    if name.endswith("_bytes"):
        limits.append((-MAX_BYTES, MAX_BYTES, "bytes is not a plausible size"))
    if _is_step_count(name):
        limits.append((0, MAX_STEPS, f"is not a plausible number of steps (0 to {MAX_STEPS:,})"))
    if name in NON_NEGATIVE:
        limits.append((0, MAX_INT, "cannot be negative"))
    if name in FP32_RANGE_FIELDS:
        limits.append((-MAX_FP32, MAX_FP32, "is beyond fp32's range"))
    if not limits and not numerics:
        limits.append((-MAX_MAGNITUDE, MAX_MAGNITUDE, "is not a plausible value"))
    return tuple(limits)


@cache
def _number_checker(name: str, numerics: bool = False):
    limits = number_limits(name, numerics)
    nonfinite_ok = name in NONFINITE_FIELDS

    def check(value) -> None:
        if value != value or value in (math.inf, -math.inf):
            if not nonfinite_ok:
                raise _Bad(f"{value} is not a valid value here")
            return
        for low, high, problem in limits:
            if not low <= value <= high:
                raise _Bad(f"{_describe(value)} {problem}")
        if isinstance(value, int) and not -MAX_INT <= value <= MAX_INT:
            raise _Bad(f"{_describe(value)} is too large")

    return check


def number_problem(name: str, value) -> str | None:
    """Why the reader would refuse ``value`` in a field called ``name``; None if it reads it
    (the Recorder drops such a value rather than write a run its reader refuses)."""
    try:
        _number_checker(name)(value)
    except _Bad as exc:
        return exc.problem
    return None


def _check_free(value, depth: int, name: str = "", numerics: bool = False) -> None:
    """A free-form JSON value (config, environment): plain types, bounded depth."""
    if depth > MAX_DEPTH:
        raise _Bad(f"nested more than {MAX_DEPTH} levels deep")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int | float):
        _number_checker(name, numerics)(value)
    elif isinstance(value, str):
        _text_length(value, name)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            try:
                _check_free(item, depth + 1, name, numerics)
            except _Bad as exc:
                raise _at(exc, i) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            try:
                _check_free(item, depth + 1, str(key), numerics)
            except _Bad as exc:
                raise _at(exc, str(key)) from None
    else:
        raise _Bad(f"unexpected value {_describe(value)}")


def _text_length(value: str, name: str) -> None:
    limit = MAX_NAME if name in NAME_FIELDS else MAX_TEXT
    if len(value) > limit:
        raise _Bad(f"text of {len(value):,} characters is too long (at most {limit:,} here)")


@cache
def _text_checker(name: str):
    def check(value, depth: int) -> None:
        if not isinstance(value, str):
            raise _Bad(f"expected text, got {_describe(value)}")
        _text_length(value, name)
    return check


def _flag(value, depth: int) -> None:
    if not isinstance(value, bool):
        raise _Bad(f"expected true or false, got {_describe(value)}")


@cache
def _checker(tp, name: str, numerics: bool):
    """A function ``check(value, depth)`` for the type hint ``tp`` of field ``name``, built
    once per hint: a long list of steps is checked by the same closures."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        optional = type(None) in args
        subs = [_checker(a, name, numerics) for a in args if a is not type(None)]

        if len(subs) == 1:  # ``X | None``, most fields: one check, no loop (journals are long)
            only = subs[0]

            def check_optional(value, depth):
                if value is None and optional:
                    return
                only(value, depth)
            return check_optional

        def check_union(value, depth):
            if value is None and optional:
                return
            first = None
            for sub in subs:
                try:
                    sub(value, depth)
                    return
                except _Bad as exc:
                    first = first or exc
            raise first
        return check_union
    if dataclasses.is_dataclass(tp):
        return _dataclass_checker(tp, numerics)
    if origin in (list, tuple) or tp in (list, tuple):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        sub = _checker(args[0], name, numerics) if args else (
            lambda value, depth: _check_free(value, depth, name, numerics))

        def check_list(value, depth):
            if not isinstance(value, list):
                raise _Bad(f"expected a list, got {_describe(value)}")
            if depth > MAX_DEPTH:
                raise _Bad(f"nested more than {MAX_DEPTH} levels deep")
            for i, item in enumerate(value):
                try:
                    sub(item, depth + 1)
                except _Bad as exc:
                    raise _at(exc, i) from None
        return check_list
    if tp is dict or origin is dict:
        def check_dict(value, depth):
            if not isinstance(value, dict):
                raise _Bad(f"expected an object, got {_describe(value)}")
            _check_free(value, depth, name, numerics)
        return check_dict
    if tp is str:
        return _text_checker(name)
    if tp is bool:
        return _flag
    number = _number_checker(name, numerics)
    if tp is int:
        def check_int(value, depth):
            if not isinstance(value, int) or isinstance(value, bool):
                raise _Bad(f"expected a whole number, got {_describe(value)}")
            number(value)
        return check_int
    if tp is float:
        def check_float(value, depth):
            if type(value) is float:  # the common case first
                number(value)
                return
            if numerics and isinstance(value, str) and value in NONFINITE_TEXT:
                return
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise _Bad(f"expected a number, got {_describe(value)}")
            number(value)
        return check_float
    # a hint this checker does not know: at least plain JSON
    return lambda value, depth: _check_free(value, depth, name, numerics)


@cache
def _dataclass_checker(cls, numerics: bool, skip: frozenset = frozenset()):
    hints = _hints(cls)
    fields = [(f.name, _checker(hints[f.name], f.name, numerics),
               f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
              for f in dataclasses.fields(cls) if f.name not in skip]

    def check(value, depth):
        if not isinstance(value, dict):
            raise _Bad(f"expected an object, got {_describe(value)}")
        if depth > MAX_DEPTH:
            raise _Bad(f"nested more than {MAX_DEPTH} levels deep")
        for name, sub, required in fields:
            if name not in value:
                if required:
                    raise _at(_Bad("missing"), name)
                continue
            try:
                sub(value[name], depth + 1)
            except _Bad as exc:
                raise _at(exc, name) from None
        if cls in _SHAPE_CHECKS:
            _SHAPE_CHECKS[cls](value)
    return check


MAX_TIMELINE_POINTS = 20_000  # engine.measure.memory_timeline keeps a few hundred
# engine.measure.memtrack has 9 categories, DDP 10; a chart draws one curve per category
# at every point, so both are capped: 20,000 points x 60 categories took a minute to open
MAX_TIMELINE_CATEGORIES = 16
MAX_TIMELINE_VALUES = 200_000  # points x categories


def _check_timeline(value: dict) -> None:
    """A memory timeline a chart can draw: one byte count per category at each point,
    none negative, in op order, its peak point holding ``peak_bytes``."""
    points, width = value["points"], len(value["categories"])
    if not points:
        raise _at(_Bad("is empty: a timeline holds at least its peak"), "points")
    if not 0 < width <= MAX_TIMELINE_CATEGORIES:
        raise _at(_Bad(f"{width} categories: a timeline has 1 to {MAX_TIMELINE_CATEGORIES}"),
                  "categories")
    if len(points) > MAX_TIMELINE_POINTS or len(points) * width > MAX_TIMELINE_VALUES:
        raise _at(_Bad(f"{len(points):,} points of {width} categories are more than a report "
                       f"keeps ({MAX_TIMELINE_POINTS:,} points, {MAX_TIMELINE_VALUES:,} "
                       "values)"), "points")
    last = 0
    for i, point in enumerate(points):
        sizes = point["category_bytes"]
        if len(sizes) != width or any(b < 0 for b in sizes):
            bad = _Bad(f"expected {width} byte counts of 0 or more, one per category")
            raise _at(_at(_at(bad, "category_bytes"), i), "points")
        if point["op_index"] < last:
            raise _at(_at(_at(_Bad("op indices go backwards"), "op_index"), i), "points")
        last = point["op_index"]
    index = value["peak_index"]
    if not (0 <= index < len(points)
                       and sum(points[index]["category_bytes"]) == value["peak_bytes"]):
        raise _at(_Bad("is not the point holding peak_bytes"), "peak_index")


def _check_lost(value: dict) -> None:
    """Lost updates as the verdict and the table read them: shares of elements and of the
    update's norm between 0 and 1, learning rates above 0."""
    for key in ("lr", "min_lr"):
        if key in value and not value[key] > 0:
            raise _at(_Bad(f"{_describe(value[key])} is not a learning rate (above 0)"), key)
    for key in ("element_share", "norm_share", "min_lr_element_share", "min_lr_norm_share"):
        share = value.get(key)
        if share is not None and not 0 <= share <= 1:
            raise _at(_Bad(f"{_describe(share)} is not a share (0 to 1)"), key)


_SHAPE_CHECKS = {MemoryTimeline: _check_timeline, LostUpdates: _check_lost,
                 LostUpdateGroup: _check_lost}


@cache
def _lab_fields() -> dict:
    """The keys of the numerics lab's dict and the dataclasses their values come from."""
    # imported only when a report carries numerics: engine.measure.flops loads torch
    from engine.measure.flops import BlendedPeak

    return {"model": str, "precision": str, "device": str, "batch_size": int, "seq_len": int,
            "seed": int, "capabilities": dict, "model_dims": dict,
            "formats": list[FormatInfo], "demos": list[DemoResult],
            "gradients": GradientStats | None, "activations": ActivationStats | None,
            "op_trace": OpTrace | None, "mfu_dtype_mix": BlendedPeak | None,
            "advice": Advice | None}


def _check_numerics(value) -> None:
    if not isinstance(value, dict):
        raise _Bad(f"expected an object, got {_describe(value)}")
    _check_free(value, 1, numerics=True)
    for key, tp in _lab_fields().items():
        if key in value:
            try:
                _checker(tp, key, True)(value[key], 2)
            except _Bad as exc:
                raise _at(exc, key) from None


def _check_config(value) -> None:
    """The run's configuration, against ``RunConfig``'s hints (it is stored as a dict)."""
    from engine.core.config import RunConfig

    if not isinstance(value, dict):
        raise _Bad(f"expected an object, got {_describe(value)}")
    _check_free(value, 1)
    hints = _hints(RunConfig)
    for f in dataclasses.fields(RunConfig):
        if f.name in value:
            tp = list[str] if f.name == "precisions" else hints[f.name]
            try:
                _checker(tp, f.name, False)(value[f.name], 2)
            except _Bad as exc:
                raise _at(exc, f.name) from None


def validate_report(data) -> None:
    """Raise ``ValueError`` unless ``data`` (parsed JSON) is a report every view can show."""
    if not isinstance(data, dict) or "schema_version" not in data or "trials" not in data:
        raise ValueError(
            "this file is not an AmpScope report: export one with "
            "'python main.py profile ... --out report.json'"
        )
    version = data["schema_version"]
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"report schema version {_describe(version)} is not valid "
                         "(versions start at 1): the file is damaged; export it again")
    if version > SCHEMA_VERSION:
        raise ValueError(
            f"report schema version {version} is newer than this AmpScope reads "
            f"({SCHEMA_VERSION}): update AmpScope to open it"
        )
    try:
        _dataclass_checker(RunRecord, False, NOT_SERIALISED | {"config", "numerics"})(data, 0)
        if "config" in data:
            try:
                _check_config(data["config"])
            except _Bad as exc:
                raise _at(exc, "config") from None
        if data.get("numerics") is not None:
            try:
                _check_numerics(data["numerics"])
            except _Bad as exc:
                raise _at(exc, "numerics") from None
    except _Bad as exc:
        raise ValueError(str(exc)) from None


def validate_event(cls, body) -> None:
    """Raise ``ValueError`` naming the field unless ``body`` (one journal line, without its
    kind) is an event of ``cls`` every view can show: the same checks a report gets."""
    from engine.core.events import RunStarted

    try:
        _dataclass_checker(cls, False, frozenset({"config"}) if cls is RunStarted
                           else frozenset())(body, 0)
        if cls is RunStarted and "config" in body:
            try:
                _check_config(body["config"])
            except _Bad as exc:
                raise _at(exc, "config") from None
    except _Bad as exc:
        where = str(exc)
        raise ValueError(where.replace("the report: ", "", 1)) from None


def validate_lab(value) -> None:
    """The numerics lab's dict as a journal carries it."""
    try:
        _check_numerics(value)
    except _Bad as exc:
        raise ValueError(str(exc).replace("the report", "numerics", 1)) from None
