import dataclasses

import pytest

from engine.core.config import PRECISIONS
from engine.record.colors import PRECISION_COLORS
from engine.record.compare import (
    COLUMNS,
    ComparisonRow,
    baseline_reason,
    baseline_trial,
    comparison_rows,
    format_cell,
    format_table,
)
from tests.engine.sample_record import make_record


def _by_precision(rows):
    return {row.precision: row for row in rows}


def test_rows_against_fp32_baseline():
    record = make_record()
    rows = _by_precision(comparison_rows(record))
    fp32 = record.trial("fp32").summary
    bf16 = record.trial("bf16-amp").summary
    assert baseline_reason(record) is None
    assert baseline_trial(record) is record.trial("fp32")
    row = rows["bf16-amp"]
    assert row.speedup_vs_fp32 == pytest.approx(fp32.median_step_ms / bf16.median_step_ms)
    assert row.memory_saving_vs_fp32 == pytest.approx(
        1 - bf16.peak_memory_bytes / fp32.peak_memory_bytes
    )
    assert row.final_loss_diff_vs_fp32 == pytest.approx(bf16.final_loss - fp32.final_loss)
    assert rows["fp32"].speedup_vs_fp32 == pytest.approx(1.0)
    assert rows["fp16-amp"].skipped_steps == 2
    assert rows["int8"].mfu is None
    assert rows["int8"].memory_saving_vs_fp32 > 0.5


def test_trial_without_summary_has_none_everywhere_but_status():
    row = _by_precision(comparison_rows(make_record()))["fp8"]
    assert row.status == "unsupported"
    assert "8.9" in row.reason
    numbers = [f.name for f in dataclasses.fields(row) if f.name not in ("precision", "status",
                                                                        "reason")]
    assert all(getattr(row, name) is None for name in numbers)


def test_no_fp32_means_no_baseline_not_another_precision():
    record = make_record(with_fp32=False)
    rows = comparison_rows(record)
    assert [r.precision for r in rows] == ["bf16-amp", "fp16-amp", "int8", "fp8"]
    for row in rows:
        assert row.speedup_vs_fp32 is None
        assert row.memory_saving_vs_fp32 is None
        assert row.final_loss_diff_vs_fp32 is None
    assert "no fp32 trial" in baseline_reason(record)
    assert rows[0].tokens_per_s is not None


def test_failed_fp32_is_no_baseline():
    record = make_record()
    record.trials[0] = dataclasses.replace(
        record.trials[0], status="oom", reason="CUDA out of memory at step 2"
    )
    assert baseline_trial(record) is None
    assert "oom" in baseline_reason(record) and "out of memory" in baseline_reason(record)
    assert all(r.speedup_vs_fp32 is None for r in comparison_rows(record))


def test_columns_cover_the_row_exactly():
    assert len(COLUMNS) == len(dataclasses.fields(ComparisonRow))
    assert {key for key, _, _ in COLUMNS} == {f.name for f in dataclasses.fields(ComparisonRow)}


@pytest.mark.parametrize(
    ("key", "value", "text"),
    [
        ("median_step_ms", 12.34, "12.3 ms"),
        ("median_step_ms", 1234.5, "1,234 ms"),
        ("speedup_vs_fp32", 1.849, "1.85x"),
        ("mfu", 0.4123, "41.2%"),
        ("memory_saving_vs_fp32", -0.05, "-5.0%"),
        ("peak_memory_bytes", int(1.23 * 1024**3), "1.23 GiB"),
        ("peak_memory_bytes", 512, "512 B"),
        ("tokens_per_s", 25346.9, "25,347 tok/s"),
        ("final_loss_diff_vs_fp32", 0.02, "+0.0200"),
        ("skipped_steps", 3, "3"),
        ("mfu", None, "n/a"),
        ("reason", None, ""),
    ],
)
def test_format_cell(key, value, text):
    assert format_cell(key, value) == text


def test_format_table_is_aligned_and_says_na():
    text = format_table(comparison_rows(make_record()), wide=True)
    lines = text.splitlines()
    assert lines[0].startswith("Precision")
    assert len(lines) == 2 + 5
    assert "n/a" in lines[-1]
    # numeric columns right-aligned: every "Peak memory" cell ends where its header ends
    end = lines[0].index("Peak memory") + len("Peak memory")
    assert all(line[end - 3 : end] in ("GiB", "n/a") for line in lines[2:])


def test_every_precision_has_a_distinct_colour():
    assert set(PRECISION_COLORS) == set(PRECISIONS)
    assert len(set(PRECISION_COLORS.values())) == len(PRECISIONS)
