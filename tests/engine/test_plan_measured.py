"""plan beside a real trial: a CPU profile run through the CLI, then a plan of the same
shape shows the trial's measured figures next to the traced ones (from the run history, or
a report named with --measured); another shape does not.

The profile and the first plan are spawned ``main.py`` processes (the path a user takes,
end to end); the later plans read the same history through the command line's parser and
handler in the test's process."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.cli_in_process import run_cli

ROOT = Path(__file__).resolve().parents[2]
CATEGORIES = ("params_bytes", "buffers_bytes", "grads_bytes", "optimizer_bytes",
              "inputs_bytes", "weight_copies_bytes", "activations_bytes", "temporaries_bytes")


def _main(data: Path, *args):
    env = {**os.environ, "AMPSCOPE_DATA_DIR": str(data), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "main.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


def _profile(data: Path, out: Path, model: str = "tiny"):
    run = _main(data, "profile", "--model", model, "--precision", "fp32,bf16-amp",
                "--batch-size", "2", "--seq-len", "32", "--steps", "1", "--warmup", "1",
                "--device", "cpu", "--isolation", "inline", "--interleave", "off",
                "--no-kernel-profile", "--quiet", "--out", str(out))
    assert run.returncode == 0, run.stderr
    return json.loads(out.read_text(encoding="utf-8"))


PLAN = ("--model", "tiny", "--seq-len", "32", "--card", "RTX 4090", "--max-batch", "0",
        "--quiet", "--trace-as", "cpu")  # beside CPU trials: the CPU's autocast


def _plan(monkeypatch, data: Path, *args, precision: str = "fp32,bf16-amp"):
    """A plan in this process, its run history in ``data``."""
    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(data))
    run = run_cli("plan", *PLAN, "--precision", precision, *args)
    assert run.returncode == 0, run.stderr
    return run


def _mib(value: int) -> str:
    return f"{value / 2**20:.2f} MiB"


def test_cli_plan_shows_the_measured_trial_of_the_same_shape(tmp_path, monkeypatch):
    data = tmp_path / "data"
    report = _profile(data, tmp_path / "real.json")
    real = {t["precision"]: t["memory"] for t in report["trials"]}
    journal = data / "runs" / f"{report['run_id']}.jsonl"
    assert journal.is_file()

    # one plan read both ways: its JSON report and the text on stdout
    run = _main(data, "plan", *PLAN, "--precision", "fp32,bf16-amp,fp16-amp", "--batch-size",
                "2", "--out", str(tmp_path / "plan.json"))
    assert run.returncode == 0, run.stderr
    text = run.stdout
    plan = json.loads((tmp_path / "plan.json").read_text(encoding="utf-8"))
    trials = {t["precision"]: t for t in plan["trials"]}
    for precision in ("fp32", "bf16-amp"):
        measured = trials[precision]["measured"]
        assert measured["source"] == str(journal) and measured["run_id"] == report["run_id"]
        assert measured["memory"] == real[precision]  # the report's own figures
        traced = trials[precision]["memory"]
        total = real[precision]["total_bytes"]
        assert abs(traced["total_bytes"] - total) <= 0.02 * total, (traced, total)
        for name in CATEGORIES:
            want = real[precision][name]
            assert abs(traced[name] - want) <= 0.02 * want if want else traced[name] == 0, name
    assert trials["fp16-amp"]["measured"] is None  # never profiled

    # the table: the measured column holds the report's figure, rounded as printed
    text = text.splitlines()
    start = text.index("  traced vs measured: run "
                       f"{report['run_id']} on {report['trials'][0]['device']}")
    assert text[start + 1] == f"    from {journal}"
    peak = text[start + 3].split()
    assert peak[0] == "peak" and " ".join(peak[3:5]) == _mib(real["fp32"]["total_bytes"])
    assert max(len(line) for line in text[start:start + 12]) <= 120

    # another micro-batch, or checkpointing on: not the same step, not matched (the two
    # recipes profiled; fp16-amp has no trial at any shape)
    for args in (("--batch-size", "3"), ("--batch-size", "2", "--grad-checkpointing")):
        other = json.loads(_plan(monkeypatch, data, *args, "--json").stdout)
        assert all(t["measured"] is None for t in other["trials"]), args

    # --measured names a report from elsewhere (an empty history here); its HTML report
    # shows the measured twin beside the traced figures
    empty = tmp_path / "here"
    named = json.loads(_plan(monkeypatch, empty, "--batch-size", "2", "--measured",
                             str(tmp_path / "real.json"), "--json", "--out",
                             str(tmp_path / "plan.html"),
                             precision="fp32,bf16-amp,fp16-amp").stdout)
    assert named["trials"][0]["measured"]["source"] == str(tmp_path / "real.json")
    assert named["trials"][0]["measured"]["memory"] == real["fp32"]
    page = (tmp_path / "plan.html").read_text(encoding="utf-8")
    assert "fp32: traced vs measured" in page and _mib(real["fp32"]["total_bytes"]) in page
    shorter = run_cli("plan", "--model", "tiny", "--precision", "fp32", "--batch-size", "2",
                      "--seq-len", "16", "--card", "RTX 4090", "--max-batch", "0", "--json",
                      "--quiet", "--measured", str(tmp_path / "real.json"))
    assert shorter.returncode == 0, shorter.stderr
    assert json.loads(shorter.stdout)["trials"][0]["measured"] is None


def test_cli_plan_refuses_a_measured_file_that_is_not_a_report(tmp_path, monkeypatch):
    bad = tmp_path / "notes.json"
    bad.write_text("not json", encoding="utf-8")
    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path / "data"))
    for path, needle in ((bad, "cannot be read as a report or journal"),
                         (tmp_path / "missing.json", "is not a file")):
        run = run_cli("plan", "--model", "tiny", "--precision", "fp32", "--seq-len", "16",
                      "--measured", str(path))
        assert run.returncode == 2, run.stderr
        lines = [line for line in run.stderr.splitlines() if line.startswith("ampscope:")]
        assert len(lines) == 1 and needle in lines[0] and str(path) in lines[0], run.stderr
        assert run.stdout == ""
