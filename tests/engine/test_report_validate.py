"""Every malformed or hostile report is refused on reading, naming the file and the field."""

from __future__ import annotations

import copy
import json
import math

import pytest

from engine.numerics.lab import run_lab
from engine.record.json_report import read_json
from engine.record.validate import MAX_DEPTH, validate_report
from engine.report.json_io import write_json
from tests.engine.sample_record import make_record

# free-form objects: their inner keys are not typed (checked for plain JSON and depth only)
FREE = {"environment", "by_op", "bytes_per_param", "error_pct", "numerics", "extra"}


@pytest.fixture(scope="module")
def lab() -> dict:
    return run_lab("tiny", "fp16-amp", device="cpu", batch_size=1, seq_len=16)


@pytest.fixture
def data(lab) -> dict:
    record = make_record()
    record.numerics = lab
    return json.loads(json.dumps(record.to_dict()))


def _leaves(value, path=()):
    """Paths to every typed value of a report dict (free-form objects as one value)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*path, key)
            if key not in FREE and not (path == () and key == "config"):
                yield from _leaves(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value[:2]):  # two of each list are enough
            yield (*path, i)
            yield from _leaves(item, (*path, i))


def _where(path) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def _set(data, path, value):
    target = data
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value


def _get(data, path):
    for part in path:
        data = data[part]
    return data


def test_a_real_report_with_numerics_passes(data):
    validate_report(data)


def test_a_wrong_type_anywhere_is_refused_naming_the_field(data):
    checked = 0
    for path in _leaves(data):
        if path[0] in ("schema_version",):
            continue
        bad = copy.deepcopy(data)
        current = _get(bad, path)
        # a value of the wrong kind for whatever the field holds
        wrong = "text" if isinstance(current, list | dict) else [["nested"]]
        _set(bad, path, wrong)
        with pytest.raises(ValueError) as info:
            validate_report(bad)
        assert str(info.value).startswith(_where(path)), (path, str(info.value))
        checked += 1
    assert checked > 300  # trials, steps, memory, summaries, config, monitor, logs


def test_a_diverged_loss_is_a_measurement_but_a_nan_step_time_is_not(data, tmp_path):
    data["trials"][0]["steps"][1]["loss"] = math.nan
    data["trials"][0]["summary"]["final_loss"] = math.inf
    validate_report(data)
    data["trials"][0]["steps"][1]["step_ms"] = math.inf
    with pytest.raises(ValueError, match=r"steps\[1\]\.step_ms: inf is not a valid value"):
        validate_report(data)


@pytest.mark.parametrize(("path", "value", "message"), [
    (("config", "steps"), 3_000_000_000, "not a plausible number of steps"),
    (("trials", 0, "steps", 0, "step"), 3e9, "expected a whole number"),
    (("trials", 0, "steps", 0, "step"), 3_000_000_000, "not a plausible number of steps"),
    (("trials", 0, "summary", "steps_measured"), -1, "not a plausible number of steps"),
    (("started_s",), 1e300, "not a plausible time"),
    (("trials", 0, "memory", "params_bytes"), 10**30, "not a plausible size"),
    (("config", "batch_size"), True, "expected a whole number"),
    (("trials", 0, "param_count"), 2**70, "too large"),
    (("numerics", "demos", 0, "verdict"), 5, "expected text"),
    (("numerics", "gradients", "overall", "histogram", "counts", 0), 0.5,
     "expected a whole number"),
])
def test_implausible_values_are_refused(data, path, value, message):
    _set(data, path, value)
    with pytest.raises(ValueError, match=message) as info:
        validate_report(data)
    assert str(info.value).startswith(_where(path))


def test_deep_nesting_is_refused(data, tmp_path):
    deep = "leaf"
    for _ in range(MAX_DEPTH + 5):
        deep = {"x": deep}
    data["environment"]["deep"] = deep
    with pytest.raises(ValueError, match="nested more than"):
        validate_report(data)
    path = tmp_path / "deep.json"
    path.write_text('{"schema_version": 1, "trials": ' + "[" * 200_000 + "]" * 200_000 + "}")
    with pytest.raises(ValueError, match="deep.json is nested too deeply"):
        read_json(path)


@pytest.mark.parametrize(("version", "message"), [
    (2, "newer than this AmpScope reads"), (-1, "not valid"), (0, "not valid"),
    ("1", "not valid"), (1.5, "not valid"),
])
def test_future_and_negative_schema_versions_are_refused(data, tmp_path, version, message):
    data["schema_version"] = version
    path = tmp_path / "report.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message) as info:
        read_json(path)
    assert str(info.value).startswith(str(path))


def test_unknown_keys_are_ignored_and_old_reports_still_read(data, tmp_path):
    data["added_later"] = {"anything": [1, 2]}
    data["trials"][0]["field_from_a_newer_writer"] = 3
    del data["trials"][0]["started_s"]  # has a default: an older writer may omit it
    validate_report(data)
    record = make_record()
    assert read_json(write_json(record, tmp_path / "r.json")).to_dict() == record.to_dict()
