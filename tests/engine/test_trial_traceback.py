"""A trial that raises keeps the exception's full traceback: from the trial's own process to
the runner, into the journal and the JSON report, and back out of both; the run goes on with
the next precision, and reports written before the field existed still open."""

from __future__ import annotations

import json

from engine.core.events import TrialResult
from engine.record.bounded import MAX_TEXT, traceback_text
from engine.record.journal import read_journal, read_run
from engine.record.validate import validate_event
from engine.report.writer import write_report
from tests.engine.raising_model import MESSAGE, errored_run


def _names_the_raise(text: str) -> None:
    assert text.startswith("Traceback (most recent call last):")
    assert 'raising_model.py", line' in text and ", in broken_block\n" in text
    assert text.rstrip().endswith(MESSAGE)


def test_a_trial_process_that_raises_keeps_its_traceback_in_journal_and_report(
        tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path / "data"))
    runner = errored_run(tmp_path, ("fp32", "bf16"), isolation="process")
    fp32, bf16 = runner.record.trials
    assert fp32.status == "error" and fp32.reason == MESSAGE
    _names_the_raise(fp32.traceback)
    assert bf16.status == "ok" and bf16.traceback is None  # the run went on
    journaled = read_journal(runner.journal_path)
    assert [t.traceback for t in journaled.trials] == [fp32.traceback, None]
    write_report(journaled, tmp_path / "r.json")
    reported = read_run(tmp_path / "r.json")  # validated on the way in
    assert [t.traceback for t in reported.trials] == [fp32.traceback, None]


def test_a_report_without_tracebacks_still_opens(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path / "data"))
    runner = errored_run(tmp_path)
    write_report(runner.record, tmp_path / "new.json")
    data = json.loads((tmp_path / "new.json").read_text())
    del data["trials"][0]["traceback"]  # what an AmpScope before the field wrote
    (tmp_path / "old.json").write_text(json.dumps(data))
    (trial,) = read_run(tmp_path / "old.json").trials
    assert trial.status == "error" and trial.reason == MESSAGE and trial.traceback is None


def test_a_traceback_longer_than_the_reader_takes_keeps_its_start_and_where_it_raised():
    def deep():
        raise RuntimeError("x" * (3 * MAX_TEXT))

    try:
        deep()
    except RuntimeError as exc:
        text = traceback_text(exc)
    assert len(text) <= MAX_TEXT and "characters, the middle left out" in text
    assert text.startswith("Traceback (most recent call last):") and ", in deep\n" in text
    assert text.endswith("x\n")
    # the journal's reader takes the trial that carries it
    line = {"precision": "fp32", "status": "error", "reason": "RuntimeError", "traceback": text}
    validate_event(TrialResult, line)
