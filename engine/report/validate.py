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

from engine.events import _hints
from engine.record import SCHEMA_VERSION, RunRecord

MAX_DEPTH = 40  # nesting of free-form objects (config, environment, numerics)
MAX_TEXT = 1_000_000  # characters in one string
MAX_STEPS = 10_000_000  # any step index or step count
MAX_EPOCH_S = 1e11  # absolute times are epoch seconds (year ~5000); relative ones are small
MAX_BYTES = 2**60
MAX_INT = 2**63
# measurements that may legitimately be non-finite: a loss or gradient norm that
# overflowed is kept as Infinity/NaN (docs/report-schema.md, "the null rule")
NONFINITE_FIELDS = frozenset({"loss", "final_loss", "grad_norm"})
# the numerics lab writes non-finite floats as these strings (engine.numerics.lab)
NONFINITE_TEXT = frozenset({"inf", "-inf", "nan"})
# RunRecord fields that are not part of the file
NOT_SERIALISED = frozenset({"live_steps"})


class _Bad(ValueError):
    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where or 'the report'}: {problem}")


def _describe(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_step_count(name: str) -> bool:
    return name in ("step", "steps", "warmup") or name.endswith("_steps") or name.startswith(
        "steps_")


def _is_time(name: str) -> bool:
    return name.endswith("_s") and not name.endswith("per_s")  # tokens_per_s is a rate


def _check_number(name: str, value, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        if name not in NONFINITE_FIELDS:
            raise _Bad(where, f"{value} is not a valid value here")
        return
    if _is_time(name) and not -MAX_EPOCH_S <= value <= MAX_EPOCH_S:
        raise _Bad(where, f"{_describe(value)} seconds is not a plausible time")
    if name.endswith("_bytes") and not -MAX_BYTES <= value <= MAX_BYTES:
        raise _Bad(where, f"{_describe(value)} bytes is not a plausible size")
    if _is_step_count(name) and not 0 <= value <= MAX_STEPS:
        raise _Bad(where, f"{_describe(value)} is not a plausible number of steps "
                          f"(0 to {MAX_STEPS:,})")
    if isinstance(value, int) and not -MAX_INT <= value <= MAX_INT:
        raise _Bad(where, f"{_describe(value)} is too large")


def _check_free(value, where: str, depth: int) -> None:
    """A free-form JSON value (config, environment): plain types, bounded depth."""
    if depth > MAX_DEPTH:
        raise _Bad(where, f"nested more than {MAX_DEPTH} levels deep")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int | float):
        _check_number(where.rsplit(".", 1)[-1], value, where)
    elif isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise _Bad(where, f"text of {len(value):,} characters is too long")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_free(item, f"{where}[{i}]", depth + 1)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_free(item, f"{where}.{key}", depth + 1)
    else:
        raise _Bad(where, f"unexpected value {_describe(value)}")


def _check(tp, value, where: str, name: str, depth: int, numerics: bool = False) -> None:
    """``value`` (parsed JSON) against the type hint ``tp``."""
    if depth > MAX_DEPTH:
        raise _Bad(where, f"nested more than {MAX_DEPTH} levels deep")
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                _check(arg, value, where, name, depth, numerics)
                return
            except _Bad as exc:
                errors.append(exc)
        raise errors[0]
    if tp is typing.Any:
        _check_free(value, where, depth)
    elif dataclasses.is_dataclass(tp):
        _check_dataclass(tp, value, where, depth, numerics)
    elif origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, list):
            raise _Bad(where, f"expected a list, got {_describe(value)}")
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        for i, item in enumerate(value):
            if args:
                _check(args[0], item, f"{where}[{i}]", name, depth + 1, numerics)
            else:
                _check_free(item, f"{where}[{i}]", depth + 1)
    elif tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise _Bad(where, f"expected an object, got {_describe(value)}")
        _check_free(value, where, depth)
    elif tp is str:
        if not isinstance(value, str):
            raise _Bad(where, f"expected text, got {_describe(value)}")
        if len(value) > MAX_TEXT:
            raise _Bad(where, f"text of {len(value):,} characters is too long")
    elif tp is bool:
        if not isinstance(value, bool):
            raise _Bad(where, f"expected true or false, got {_describe(value)}")
    elif tp is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise _Bad(where, f"expected a whole number, got {_describe(value)}")
        _check_number(name, value, where)
    elif tp is float:
        if numerics and isinstance(value, str) and value in NONFINITE_TEXT:
            return
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise _Bad(where, f"expected a number, got {_describe(value)}")
        _check_number(name, value, where)
    else:  # a hint this checker does not know: at least plain JSON
        _check_free(value, where, depth)


def _check_dataclass(cls, value, where: str, depth: int, numerics: bool = False,
                     skip: frozenset = frozenset()) -> None:
    if not isinstance(value, dict):
        raise _Bad(where, f"expected an object, got {_describe(value)}")
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        at = f"{where}.{f.name}" if where else f.name
        if f.name not in value:
            required = (f.default is dataclasses.MISSING
                        and f.default_factory is dataclasses.MISSING)
            if required:
                raise _Bad(at, "missing")
            continue
        _check(hints[f.name], value[f.name], at, f.name, depth + 1, numerics)


@cache
def _lab_fields() -> dict:
    """The keys of the numerics lab's dict and the dataclasses their values come from."""
    # imported only when a report carries numerics: these modules load torch
    from engine.numerics.advisor import Advice
    from engine.numerics.demos import DemoResult
    from engine.numerics.formats import FormatInfo
    from engine.numerics.gradients import ActivationStats, GradientStats
    from engine.numerics.optrace import MixedPeak, OpTrace

    return {"model": str, "precision": str, "device": str, "batch_size": int, "seq_len": int,
            "seed": int, "capabilities": dict, "model_dims": dict,
            "formats": list[FormatInfo], "demos": list[DemoResult],
            "gradients": GradientStats | None, "activations": ActivationStats | None,
            "op_trace": OpTrace | None, "mfu_dtype_mix": MixedPeak | None,
            "advice": Advice | None}


def _check_numerics(value, where: str) -> None:
    if not isinstance(value, dict):
        raise _Bad(where, f"expected an object, got {_describe(value)}")
    _check_free(value, where, 1)
    for key, tp in _lab_fields().items():
        if key in value:
            _check(tp, value[key], f"{where}.{key}", key, 2, numerics=True)


def _check_config(value, where: str) -> None:
    """The run's configuration, against ``RunConfig``'s hints (it is stored as a dict)."""
    from engine.config import RunConfig

    if not isinstance(value, dict):
        raise _Bad(where, f"expected an object, got {_describe(value)}")
    _check_free(value, where, 1)
    hints = _hints(RunConfig)
    for f in dataclasses.fields(RunConfig):
        if f.name in value:
            tp = list[str] if f.name == "precisions" else hints[f.name]
            _check(tp, value[f.name], f"{where}.{f.name}", f.name, 2)


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
    _check_dataclass(RunRecord, {k: v for k, v in data.items()
                                 if k not in ("config", "numerics")},
                     "", 0, skip=NOT_SERIALISED | {"config", "numerics"})
    if "config" in data:
        _check_config(data["config"], "config")
    if data.get("numerics") is not None:
        _check_numerics(data["numerics"], "numerics")
