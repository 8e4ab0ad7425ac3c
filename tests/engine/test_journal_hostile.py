"""A journal is input: every damaged or absurd event is refused naming the file, the line
and the field, by the same schema reports pass, so no view is handed what it cannot show."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from engine.core.config import RunConfig
from engine.record.journal import journal_entry, read_journal
from engine.record.validate import MAX_NAME
from engine.run.runner import Runner

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lines():
    """The lines of a real run's journal (tiny preset, CPU, inline)."""
    runner = Runner(RunConfig(model="tiny", precisions=("fp32",), batch_size=1, seq_len=16,
                              steps=2, warmup=1, device="cpu", isolation="inline"))
    runner.run()
    return [json.loads(x) for x in runner.journal_path.read_text().splitlines()]


def _deep(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels):
        value = {"a": value}
    return value


def _index(lines, kind: str) -> int:
    return next(i for i, line in enumerate(lines) if line["e"] == kind)


# (what is done to the journal, the field the message must name): the cases
def _set_run(key, value):
    def damage(lines):
        lines[_index(lines, "run")][key] = value
    return damage


def _set_config(key, value):
    def damage(lines):
        lines[_index(lines, "run")]["config"][key] = value
    return damage


def _set_first(kind, key, value):
    def damage(lines):
        lines[_index(lines, kind)][key] = value
    return damage


def _set_result(path, value):
    def damage(lines):
        node = lines[_index(lines, "done")]["result"]
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
    return damage


RUN_LINE_CASES = {
    "time_s is text": (_set_run("time_s", "x"), "time_s"),
    "time_s is huge": (_set_run("time_s", 1e300), "time_s"),
    "time_s is NaN": (_set_run("time_s", math.nan), "time_s"),
    "config is a list": (_set_run("config", []), "config"),
    "environment is text": (_set_run("environment", "x"), "environment"),
    "precisions is a number": (_set_config("precisions", 3), "config.precisions"),
    "environment nested 100 deep": (_set_run("environment", _deep(100)), "environment"),
    "run id of a million characters": (_set_run("run_id", "r" * 1_000_000), "run_id"),
    "model name of a million characters": (_set_config("model", "m" * 1_000_000),
                                           "config.model"),
}
LATER_CASES = {
    "precision of a million characters": (_set_first("trial", "precision", "p" * 1_000_000),
                                          "precision"),
    "step time of 1e308": (_set_first("step", "step_ms", 1e308), "step_ms"),
    "step index that is text": (_set_first("step", "step", "three"), "step"),
    "module depth of -3": (_set_result(("module_tree", 0, "depth"), -3),
                           "result.module_tree[0].depth"),
    "reason of a million characters": (_set_result(("reason",), "x" * 1_000_000),
                                       "result.reason"),
    "unknown event": (lambda lines: lines.insert(3, {"e": "bogus"}), "bogus"),
}


def _write(tmp_path, lines, damage) -> Path:
    lines = json.loads(json.dumps(lines))  # a copy
    damage(lines)
    path = tmp_path / "damaged.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


@pytest.mark.parametrize("case", list(RUN_LINE_CASES) + list(LATER_CASES))
def test_a_damaged_event_is_refused_naming_file_line_and_field(lines, tmp_path, case):
    damage, field = {**RUN_LINE_CASES, **LATER_CASES}[case]
    path = _write(tmp_path, lines, damage)
    with pytest.raises(ValueError) as error:
        read_journal(path)
    message = str(error.value)
    assert str(path) in message and "line " in message and field in message
    assert len(message) < 2000  # the message quotes the value, never all of it


@pytest.mark.parametrize("case", list(RUN_LINE_CASES))
def test_history_lists_a_journal_with_a_damaged_start_as_damaged(lines, tmp_path, case):
    damage, field = RUN_LINE_CASES[case]
    entry = journal_entry(_write(tmp_path, lines, damage))
    assert entry is not None and entry.status == "damaged"
    assert "line 2" in entry.problem and field in entry.problem
    assert len(entry.run_id) <= MAX_NAME


def test_the_real_journal_still_reads(lines, tmp_path):
    path = _write(tmp_path, lines, lambda _: None)
    assert read_journal(path).trials[0].status == "ok"
    assert journal_entry(path).status == "ok"


def test_a_foreign_end_status_is_not_shown(lines, tmp_path):
    def damage(lines):
        _set_first("end", "status", "x" * 100_000)(lines)
        lines[0]["pid"] = 99_999_999  # no such process: the writer is gone
    path = _write(tmp_path, lines, damage)
    assert journal_entry(path).status == "interrupted"


def test_report_exits_2_on_a_journal_it_cannot_read(lines, tmp_path):
    path = _write(tmp_path, lines, _set_run("time_s", "x"))
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "main.py", "report", str(path), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert str(path) in done.stderr and "time_s" in done.stderr
    assert not out.exists()


# --- the CLI: watch and profile on hostile input, through the real process ---------------


def _main(*args, timeout=300):
    return subprocess.run([sys.executable, "main.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("case", ["step time of 1e308", "module depth of -3",
                                  "precision of a million characters", "unknown event"])
def test_watch_refuses_a_damaged_event_with_one_line(lines, tmp_path, case):
    damage, field = LATER_CASES[case]
    done = _main("watch", str(_write(tmp_path, lines, damage)), "--interval", "0.05")
    assert done.returncode == 2, done.stderr
    assert field in done.stderr and "line " in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr) < 2000


def test_watch_ends_when_the_writer_is_gone_without_an_end(lines, tmp_path):
    def cut(lines):
        del lines[_index(lines, "done"):]
        lines[0]["pid"] = 99_999_999  # no such process
    done = _main("watch", str(_write(tmp_path, lines, cut)), "--interval", "0.05")
    assert done.returncode == 1, done.stderr
    steps = sum(1 for line in lines if line["e"] == "step")
    assert "run interrupted: the process that wrote it (pid 99999999) is gone" in done.stdout
    assert f"{steps} steps" in done.stdout


def test_watch_notices_a_journal_cut_short(lines, tmp_path):
    from engine.record.follow import JournalFollower

    path = _write(tmp_path, lines, lambda _: None)
    follower = JournalFollower(path)
    assert follower.poll()
    path.write_text(path.read_text()[:100])
    with pytest.raises(ValueError, match="cut short while it was watched"):
        follower.poll()


@pytest.mark.parametrize("interval", ["inf", "nan", "-1", "1e9"])
def test_watch_refuses_an_interval_it_cannot_sleep(lines, tmp_path, interval):
    path = _write(tmp_path, lines, lambda _: None)
    done = _main("watch", str(path), "--interval", interval)
    assert done.returncode == 2 and "--interval" in done.stderr, done.stderr


def test_watch_and_report_refuse_what_is_not_a_file(tmp_path):
    for command in (("watch", "/dev/zero"), ("report", "/dev/zero",
                                             "--out", str(tmp_path / "r.json"))):
        done = _main(*command, timeout=120)
        assert done.returncode == 2, done.stderr
        assert "/dev/zero" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("flag,value", [("--steps", "3000000000"), ("--warmup", "20000000")])
def test_profile_refuses_more_steps_than_a_report_holds_up_front(tmp_path, flag, value):
    out = tmp_path / "r.json"
    done = _main("profile", "--model", "tiny", "--precision", "fp32", flag, value,
                 "--device", "cpu", "--out", str(out))
    assert done.returncode == 2 and flag in done.stderr and "10,000,000" in done.stderr
    assert not out.exists()


def test_csv_cells_from_names_are_never_formulas(lines, tmp_path):
    import csv

    evil = "=HYPERLINK(\"http://x\",\"y\")"

    def rename(lines):
        for line in lines:
            if line.get("precision") == "fp32":
                line["precision"] = evil
            if line["e"] == "done":
                line["result"]["precision"] = evil
        lines[_index(lines, "run")]["config"]["precisions"] = [evil]
    out = tmp_path / "steps.csv"
    done = _main("report", str(_write(tmp_path, lines, rename)), "--out", str(out))
    assert done.returncode == 0, done.stderr
    for name in (out, tmp_path / "steps.comparison.csv"):
        cells = [cell for row in csv.reader(name.open()) for cell in row]
        assert "'" + evil in cells, name
        assert not any(cell.startswith(("=", "+", "@")) for cell in cells), name
        # numbers stay numbers: a negative value is not a formula to a spreadsheet... but a
        # leading '-' on text is; no text cell here starts with it
        assert not any(cell.startswith("-") and not _number(cell) for cell in cells), name


def _number(cell: str) -> bool:
    try:
        float(cell)
        return True
    except ValueError:
        return False


def test_out_through_a_symlink_to_a_fifo_is_refused_and_the_fifo_kept(lines, tmp_path):
    import os
    import stat

    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    link = tmp_path / "report.json"
    link.symlink_to(fifo)
    done = _main("report", str(_write(tmp_path, lines, lambda _: None)), "--out", str(link))
    assert done.returncode == 2 and "not a regular file" in done.stderr, done.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and link.is_symlink()
