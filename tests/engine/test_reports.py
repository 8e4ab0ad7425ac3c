import csv
import dataclasses
import html
import json
import math
import os
import re
from pathlib import Path

import pytest

from engine.core import events
from engine.record.compare import record_precisions
from engine.record.json_report import read_json
from engine.record.run_record import RunRecord
from engine.report import charts
from engine.report.csv_io import STEP_COLUMNS, write_csv
from engine.report.html import render_html, write_html
from engine.report.json_io import write_json
from engine.report.writer import check_writable, write_report
from tests.engine.sample_record import make_record

SCHEMA_DOC = Path(__file__).resolve().parents[2] / "docs" / "report-schema.md"


@pytest.fixture
def record() -> RunRecord:
    return make_record()


# --- JSON ----------------------------------------------------------------------------


def test_json_round_trip_gives_equal_objects(record, tmp_path):
    path = write_json(record, tmp_path / "run.json")
    back = read_json(path)
    assert back.trials == record.trials
    assert back.monitor_samples == record.monitor_samples
    assert back.logs == record.logs
    assert back.config == record.config and back.environment == record.environment
    assert back.trial("fp32").dtype_map[0].shape == (50257, 768)  # tuples survive
    assert back.to_dict() == record.to_dict()


def test_json_keeps_a_diverged_loss(record, tmp_path):
    fp16 = record.trial("fp16-amp")
    steps = [dataclasses.replace(fp16.steps[0], loss=math.inf), *fp16.steps[1:]]
    record.trials[2] = dataclasses.replace(fp16, steps=steps)
    back = read_json(write_json(record, tmp_path / "run.json"))
    assert back.trial("fp16-amp").steps[0].loss == math.inf


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "not found"),
        ("{ not json", "not valid JSON"),
        ('{"hello": 1}', "not an AmpScope report"),
        ('{"schema_version": 99, "trials": []}', "newer"),
        ('{"schema_version": 1, "trials": [{"status": "ok"}]}', r"trials\[0\]\.precision: missing"),
    ],
)
def test_read_json_errors_are_value_errors(tmp_path, content, message):
    path = tmp_path / "report.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message) as info:
        read_json(path)
    assert "report.json" in str(info.value)


# --- atomic writes -------------------------------------------------------------------


def _explode(*args, **kwargs):
    raise RuntimeError("serialiser broke half-way")


def test_failed_json_write_leaves_no_file(record, tmp_path, monkeypatch):
    real_dump = json.dump

    def dump_then_fail(obj, fh, **kwargs):
        real_dump(obj["config"], fh)  # some bytes reach the temporary file first
        _explode()

    monkeypatch.setattr(json, "dump", dump_then_fail)
    with pytest.raises(RuntimeError):
        write_json(record, tmp_path / "run.json")
    assert list(tmp_path.iterdir()) == []


def test_failed_write_keeps_the_previous_report(record, tmp_path, monkeypatch):
    path = tmp_path / "run.csv"
    write_csv(record, path)
    before = path.read_bytes()
    monkeypatch.setattr(os, "replace", _explode)
    with pytest.raises(RuntimeError):
        write_csv(make_record(with_fp32=False), path)
    assert path.read_bytes() == before
    # the steps and, beside them, the comparison table (csv_io.comparison_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.comparison.csv", "run.csv"]


def test_failed_html_render_leaves_no_file(record, tmp_path, monkeypatch):
    monkeypatch.setattr(charts, "format_cell", _explode)
    with pytest.raises(RuntimeError):
        write_html(record, tmp_path / "run.html")
    assert list(tmp_path.iterdir()) == []


# --- CSV -----------------------------------------------------------------------------


def test_csv_has_one_row_per_step(record, tmp_path):
    path = write_csv(record, tmp_path / "steps.csv")
    with path.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert tuple(rows[0]) == STEP_COLUMNS
    assert len(rows) == sum(len(t.steps) for t in record.trials) == 20
    int8 = [r for r in rows if r["precision"] == "int8"]
    assert int8[0]["mfu"] == ""  # None is an empty cell, not 0
    assert float(int8[1]["step_ms"]) == record.trial("int8").steps[1].step_ms
    fp16 = [r for r in rows if r["precision"] == "fp16-amp"]
    assert [r["skipped"] for r in fp16[:3]] == ["True", "True", "False"]


def test_csv_includes_a_trial_still_running(record, tmp_path):
    live = dataclasses.replace(record.trial("fp32").steps[0], precision="bf16")
    record.live_steps["bf16"] = [live]
    assert record_precisions(record)[-1] == "bf16"
    with write_csv(record, tmp_path / "steps.csv").open(encoding="utf-8") as fh:
        assert sum(1 for row in csv.DictReader(fh) if row["precision"] == "bf16") == 1


# --- HTML ----------------------------------------------------------------------------


def test_html_is_self_contained_and_says_na(record, tmp_path):
    text = write_html(record, tmp_path / "run.html").read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", text)
    assert "<script" not in text and "<link" not in text
    assert text.count("<svg") == 7
    for precision in ("fp32", "bf16-amp", "fp16-amp", "int8", "fp8"):
        assert f"</span>{precision}" in text
    # int8 has no MFU: the reason is shown, not a number
    assert "n/a</span>: no datasheet peak for int8 matmuls on A100" in text
    assert "fp8 training needs compute capability 8.9+" in text
    assert "<details><summary>dtype map (3 parameters)" in text
    assert "lm_head is tied to wte" in text


def test_html_escapes_text_from_the_record(record):
    record.logs.append(events.LogEvent("error", "<script>alert(1)</script> & more"))
    record.config["model"] = "<b>evil</b>"
    text = render_html(record)
    assert "<script>" not in text and "<b>evil</b>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in text


def test_html_renders_numerics_generically(record):
    record.numerics = {
        "fp16_absorbs": {"expression": "1 + 0.0001", "fp32": 1.0001, "fp16": 1.0},
        "overflow": [{"dtype": "fp16", "sum": math.inf}, {"dtype": "bf16", "sum": 65536.0}],
    }
    text = render_html(record)
    section = text[text.index("<h2>Numerics</h2>") : text.index("<h2>Log</h2>")]
    assert "<th>fp16_absorbs</th>" in section and "1 + 0.0001" in section
    assert "<th>dtype</th><th>sum</th>" in section and "inf" in section


def test_html_without_baseline_or_monitor(tmp_path):
    record = make_record(with_fp32=False)
    record.monitor_samples.clear()
    text = render_html(record)
    assert "Baseline n/a: no fp32 trial in this run" in text
    assert "n/a: no monitor samples were recorded" in text


# --- charts --------------------------------------------------------------------------


def test_charts_say_why_they_are_missing(record):
    record.trials = [t for t in record.trials if t.precision != "fp16-amp"]
    scale = charts.loss_scale_chart(record)
    assert scale.svg is None and "GradScaler" in scale.note
    mfu = charts.mfu_chart(record)
    assert mfu.svg is not None and "int8: no datasheet peak" in mfu.note


def test_mfu_chart_without_any_mfu_is_a_note_not_zero_bars(record):
    record.trials = [record.trial("int8"), record.trial("fp8")]
    chart = charts.mfu_chart(record)
    assert chart.svg is None and "int8" in chart.note


def test_memory_chart_marks_predicted_total(record):
    svg = charts.memory_chart(record).svg
    assert "predicted total" in svg and "optimizer state" in svg and "GiB" in svg


def test_host_monitor_chart(record):
    record.monitor_samples = [
        events.MonitorSample(time_s=record.started_s + i, source="host", cpu_pct=50.0 + i,
                             host_rss_bytes=(800 + i) * 1024**2)
        for i in range(10)
    ]
    chart = charts.monitor_chart(record)
    assert "psutil" in chart.note and "CPU (%)" in chart.svg and "MiB" in chart.svg


# --- writer --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["r.json", "r.csv", "r.html", "R.HTM"])
def test_write_report_by_extension(record, tmp_path, name):
    path = write_report(record, tmp_path / name)
    assert path.stat().st_size > 0
    beside = ["r.comparison.csv"] if name.endswith(".csv") else []  # the comparison table
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, *beside])


def test_unknown_extension(record, tmp_path):
    with pytest.raises(ValueError, match=r"unknown report extension '\.xyz': use \.json, \.csv"):
        write_report(record, tmp_path / "r.xyz")
    with pytest.raises(ValueError, match="unknown report extension"):
        check_writable(tmp_path / "report")


def test_check_writable(tmp_path):
    check_writable(tmp_path / "ok.json")
    with pytest.raises(ValueError, match="does not exist"):
        check_writable(tmp_path / "missing" / "r.json")
    folder = tmp_path / "a.json"
    folder.mkdir()
    with pytest.raises(ValueError, match="is a folder"):
        check_writable(folder)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write to read-only folders")
def test_check_writable_read_only_folder(tmp_path):
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(ValueError, match="not writable"):
            check_writable(tmp_path / "r.json")
    finally:
        tmp_path.chmod(0o700)


# --- schema document -----------------------------------------------------------------


def test_schema_doc_names_every_field():
    doc = SCHEMA_DOC.read_text(encoding="utf-8")
    classes = [
        events.TrialResult, events.StepSample, events.TrialSummary, events.MemoryBreakdown,
        events.PredictedMemory, events.FlopsInfo, events.ParamInfo, events.ModuleInfo,
        events.MonitorSample, events.LogEvent,
    ]
    missing = [
        f"{cls.__name__}.{f.name}"
        for cls in classes
        for f in dataclasses.fields(cls)
        if f"`{f.name}`" not in doc
    ]
    missing += [f"top level {key}" for key in make_record().to_dict() if f"`{key}`" not in doc]
    missing += [f"status {s}" for s in events.TRIAL_STATUSES if f"`{s}`" not in doc]
    assert missing == []


# --- a real run ----------------------------------------------------------------------


def test_real_tiny_run_writes_all_three_formats(tmp_path):
    from engine.core.config import RunConfig
    from engine.run.runner import Runner

    config = RunConfig(model="tiny", precisions=("fp32", "bf16-amp"), steps=3, warmup=1,
                       batch_size=2, seq_len=32, isolation="inline", device="cpu")
    record = Runner(config, on_event=lambda event: None).run()
    assert [t.status for t in record.trials] == ["ok", "ok"]

    back = read_json(write_report(record, tmp_path / "run.json"))
    assert back.trials == record.trials

    with write_report(record, tmp_path / "run.csv").open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == sum(len(t.steps) for t in record.trials) == 2 * (3 + 1)
    assert {r["precision"] for r in rows} == {"fp32", "bf16-amp"}

    text = write_report(record, tmp_path / "run.html").read_text(encoding="utf-8")
    assert "</span>fp32" in text and "</span>bf16-amp" in text
    summary = record.trial("fp32").summary
    assert summary.mfu is None  # the CPU has no datasheet peak: n/a, with the reason
    assert f"n/a</span>: {html.escape(summary.mfu_reason)}" in text
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", text)
