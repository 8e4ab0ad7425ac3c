"""Every run written reads back (issue #32), through the real ``python3 main.py report``
and ``watch`` processes: a user's huge run name and exception message are cut with a note,
a damaged step line is named (exit 2), unknown keys are not kept per step, a precision
name matplotlib would read as a formula is plain text, and ``watch`` on an empty journal
ends as interrupted instead of waiting forever."""

import json
import os
import subprocess
import sys
import time
import warnings

import pytest
import torch

import ampscope
from engine.core.events import RunFinished, RunStarted, StepSample, TrialStarted
from engine.record.journal import JournalWriter, read_journal
from engine.record.validate import MAX_NAME, MAX_TEXT
from tests.engine.test_recorder import padded_batch, tiny_gpt2
from tests.engine.test_trainer_callback import ROOT


def _main(*args, timeout=600):
    return subprocess.run([sys.executable, "main.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def _step(precision: str, i: int) -> StepSample:
    return StepSample(precision=precision, step=i, warmup=i < 2, loss=3.0 - i / 100,
                      step_ms=12.5, tokens_per_s=None, tflops=None, mfu=None,
                      allocated_bytes=None, reserved_bytes=None, loss_scale=None,
                      skipped=False, grad_norm=1.5, time_s=1.8e9 + i, tokens=64)


def _journal(path, precision: str = "fp32", steps: int = 4):
    writer = JournalWriter(path)
    writer.write(RunStarted("readback01", {"model": "m", "precisions": [precision],
                                           "source": "user-loop"}, {}, 1.8e9))
    writer.write(TrialStarted(precision, 0, 1, 1.8e9))
    for i in range(steps):
        writer.write(_step(precision, i))
    writer.write(RunFinished("ok", 1.8e9 + steps))
    writer.close()
    return path


def test_a_huge_run_name_and_exception_message_are_cut_and_the_report_opens(tmp_path):
    journal = tmp_path / "huge.jsonl"
    name, message = "n" * 5000, "m" * 150_000
    model = tiny_gpt2()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(ValueError):
        warnings.simplefilter("always")
        with ampscope.Recorder(model, opt, name=name, journal=journal) as rec:
            for i in range(3):
                loss = model(**padded_batch(i)).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
                rec.step(loss=loss)
            raise ValueError(message)
    assert any("name has 5,000 characters" in str(w.message) for w in caught)
    out = tmp_path / "huge.json"
    done = _main("report", str(journal), "--out", str(out))
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    model_name = report["config"]["model"]
    assert len(model_name) <= MAX_NAME and model_name.startswith("n" * 4000)
    assert "cut: 5,000 characters" in model_name
    (trial,) = report["trials"]
    assert trial["status"] == "error" and len(trial["reason"]) <= MAX_TEXT
    assert trial["reason"].startswith("ValueError: " + "m" * 90_000)
    assert "cut: 150,012 characters" in trial["reason"]
    assert len(trial["steps"]) == 3


def test_a_step_line_with_a_list_for_its_precision_is_named_and_refused(tmp_path):
    journal = _journal(tmp_path / "prec.jsonl")
    lines = journal.read_text().splitlines()
    numbered = [i for i, line in enumerate(lines) if json.loads(line)["e"] == "step"]
    damaged = json.loads(lines[numbered[1]])
    damaged["precision"] = ["fp32"]
    lines[numbered[1]] = json.dumps(damaged)
    journal.write_text("\n".join(lines) + "\n")
    done = _main("report", str(journal), "--out", str(tmp_path / "prec.html"))
    assert done.returncode == 2
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and "TypeError" not in done.stderr
    assert f"line {numbered[1] + 1}" in err[0] and "precision" in err[0]
    assert not (tmp_path / "prec.html").exists()


# a small parent: a child's peak RSS starts from its parent's at fork (pytest holds torch)
PEAK_RSS = ("import os, subprocess, sys; p = subprocess.Popen(sys.argv[1:]); "
            "_, status, usage = os.wait4(p.pid, 0); "
            "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024)")


def _peak_rss_of_report(journal, out) -> int:
    """Peak resident bytes of one real ``main.py report`` process (its own rusage)."""
    done = subprocess.run([sys.executable, "-c", PEAK_RSS, sys.executable, "main.py",
                           "report", str(journal), "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    code, peak = done.stdout.split()[-2:]
    assert code == "0", done.stderr
    return int(peak)  # ru_maxrss: kilobytes on Linux, made bytes above


def test_unknown_keys_are_not_kept_per_step(tmp_path):
    """The same journal with and without one key of its own on every step line: the
    unknown keys cost the reader next to nothing (they cost 12x the file before)."""
    steps = 40_000
    plain = _journal(tmp_path / "plain.jsonl", steps=steps)
    lines = plain.read_text().splitlines()
    with open(tmp_path / "keys.jsonl", "w") as fh:
        for line in lines:
            data = json.loads(line)
            if data["e"] == "step":
                data[f"newer_field_{data['step']}"] = data["step"]
            fh.write(json.dumps(data, separators=(",", ":")) + "\n")
    keyed = tmp_path / "keys.jsonl"
    extra_bytes = keyed.stat().st_size - plain.stat().st_size
    assert extra_bytes > 0.1 * plain.stat().st_size
    with_keys = _peak_rss_of_report(keyed, tmp_path / "k.csv")
    without = _peak_rss_of_report(plain, tmp_path / "p.csv")
    assert (with_keys - without) < 0.5 * keyed.stat().st_size, (with_keys, without)
    # and the steps are all there
    assert (tmp_path / "k.csv").read_text().count("\n") == steps + 1


MATH = r"$\frac{}{}$"


def test_a_precision_name_matplotlib_reads_as_a_formula_is_plain_text(tmp_path):
    journal = _journal(tmp_path / "math.jsonl", precision=MATH)
    out = tmp_path / "math.html"
    done = _main("report", str(journal), "--out", str(out))
    assert done.returncode == 0, done.stderr
    html = out.read_text()
    assert r"\frac{}{}" in html and "<svg" in html


def test_watch_on_an_empty_journal_left_by_a_dead_writer_ends_as_interrupted(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.touch()
    old = time.time() - 120
    os.utime(empty, (old, old))
    done = _main("watch", str(empty), "--interval", "0.05")
    assert done.returncode == 1
    assert "run interrupted" in done.stdout and "no journal header line" in done.stdout


def test_watch_on_a_new_empty_journal_waits_for_its_writer(tmp_path):
    journal = tmp_path / "new.jsonl"
    journal.touch()
    proc = subprocess.Popen([sys.executable, "main.py", "watch", str(journal), "--interval",
                             "0.05"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    time.sleep(1)  # the watcher polls the empty file first
    _journal(journal)  # the writer adds its header and the run as a journal's writer does
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "run ended: ok, 4 steps" in out
    assert read_journal(journal).status == "ok"
