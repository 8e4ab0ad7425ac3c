import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.cli import main

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--model", "tiny", "--batch-size", "1", "--seq-len", "16", "--steps", "2",
        "--warmup", "0", "--device", "cpu", "--isolation", "inline", "--quiet"]


PROGRESS = ("loading torch", "numerics: ", "[")  # footprint's and numerics' progress lines


def _error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.strip().splitlines()
           if not line.startswith(PROGRESS)]
    assert len(err) == 1, err
    assert err[0].startswith("ampscope: error: ")
    return err[0]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--model", "no-such-model"], "not a preset"),
        (["--model", "./missing/folder"], "does not exist"),
        (["--precision", "fp12"], "unknown precision"),
        (["--batch-size", "0"], "--batch-size"),
        (["--steps", "-3"], "--steps"),
        (["--seq-len", "4096"], "--seq-len 512 or less"),
        (["--optimizer", "lion"], "invalid choice"),
    ],
)
def test_bad_profile_input_is_one_line_and_exit_2(args, fragment, tmp_path, capsys, hub_offline):
    out = tmp_path / "report.json"
    code = main(["profile", *TINY, *args, "--out", str(out)])
    assert code == 2
    assert fragment in _error_line(capsys)
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda(capsys):
    assert main(["profile", "--model", "tiny", "--device", "cuda"]) == 2
    assert "no usable CUDA GPU" in _error_line(capsys)


def test_unwritable_out_fails_before_the_run(tmp_path, capsys):
    assert main(["profile", *TINY, "--out", str(tmp_path / "nope" / "r.json")]) == 2
    assert "nope" in _error_line(capsys)
    assert main(["profile", *TINY, "--out", str(tmp_path / "r.pdf")]) == 2
    assert ".pdf" in _error_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_profile_prints_the_table_and_writes_each_format(tmp_path, capsys):
    for ext in ("json", "csv", "html"):
        out = tmp_path / f"r.{ext}"
        assert main(["profile", *TINY, "--precision", "fp32,bf16,tf32", "--out", str(out)]) == 0
        text = capsys.readouterr().out
        assert "Speed-up [95% CI]" in text and "unsupported" in text
        assert out.stat().st_size > 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert {"schema_version", "environment", "config", "trials", "monitor_samples"} <= set(report)
    statuses = {t["precision"]: t["status"] for t in report["trials"]}
    assert statuses == {"fp32": "ok", "bf16": "ok", "tf32": "unsupported"}
    step = report["trials"][0]["steps"][0]
    assert {"step", "loss", "step_ms", "tokens_per_s", "tflops", "mfu", "allocated_bytes",
            "reserved_bytes", "loss_scale", "skipped", "grad_norm"} <= set(step)


def test_footprint_json_gives_gpt2_figures(capsys):
    assert main(["footprint", "--model", "gpt2", "--precision", "fp32,fp16,tf32", "--json"]) == 0
    rows = {r["precision"]: r for r in json.loads(capsys.readouterr().out)}
    assert round(rows["fp32"]["footprint_bytes"] / 2**20, 2) == 474.70
    assert round(rows["fp16"]["footprint_bytes"] / 2**20, 2) == 237.35
    assert rows["fp32"]["params"] == 124_439_808
    assert rows["tf32"]["status"] == "unsupported" and rows["tf32"]["footprint_bytes"] is None


def test_presets_and_version_through_main_py():
    run = subprocess.run([sys.executable, "main.py", "presets"], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert "124,439,808" in run.stdout
    # stderr holds the progress lines and no library warning
    assert all(line.startswith(("counting each preset", "["))
               for line in run.stderr.splitlines())
    version = subprocess.run([sys.executable, "main.py", "--version"], cwd=ROOT,
                             capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("AmpScope ")
    bad = subprocess.run([sys.executable, "main.py", "profile", "--batch-size", "0"], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_failed_trials_exit_1_with_the_table_and_a_summary(monkeypatch, capsys):
    from engine.run import trial_setup

    real = trial_setup.load_model

    def flaky(model, recipe, *a, **k):
        if recipe.precision in ("fp32", "bf16"):
            raise RuntimeError("driver fell over")
        return real(model, recipe, *a, **k)

    monkeypatch.setattr(trial_setup, "load_model", flaky)
    code = main(["profile", *TINY, "--precision", "fp32,bf16,fp16-amp,tf32"])
    captured = capsys.readouterr()
    assert code == 1
    assert "driver fell over" in captured.out and "Speed-up [95% CI]" in captured.out
    last = captured.err.strip().splitlines()[-1]
    # no --out: the run's journal holds the tracebacks
    assert last.startswith("2 of 4 trials failed: see the reasons above (tracebacks: "
                           "python main.py report ")
    assert last.endswith(".jsonl --traceback)")


def _model_folder(tmp_path, breakage: str) -> Path:
    """A model folder broken the way ``breakage`` says, saved by transformers first."""
    from engine.models.load import model_class
    from engine.models.presets import get_preset

    folder = tmp_path / breakage
    preset = get_preset("tiny")
    model_class(preset.task).from_config(preset.build_config()).save_pretrained(folder)
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text())
    weights = folder / "model.safetensors"
    if breakage == "corrupt-config":
        config_file.write_text('{"model_type": "gpt2", ')
        return folder
    if breakage == "truncated-weights":
        with open(weights, "r+b") as fh:
            fh.truncate(weights.stat().st_size // 2)
    elif breakage == "wrong-shape":
        config["n_embd"] *= 2
    elif breakage == "no-training-head":
        config.update(model_type="clip_vision_model", architectures=["CLIPVisionModel"])
    elif breakage == "unknown-type":
        config["model_type"] = "no-such-architecture"
    elif breakage == "remote-code":
        config.update(model_type="mything", auto_map={"AutoConfig": "cfg.MyConfig",
                                                      "AutoModelForCausalLM": "mod.MyModel"})
    config_file.write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    ("breakage", "fragment"),
    [
        ("corrupt-config", "config.json is not valid JSON"),
        ("truncated-weights", "damaged or cut short"),
        ("wrong-shape", "do not fit its config.json"),
        ("no-training-head", "no language-modelling head to train"),
        ("unknown-type", "no-such-architecture"),
        ("remote-code", "--trust-remote-code"),
    ],
)
def test_model_folders_that_break_transformers_are_one_line_in_every_command(
        tmp_path, capsys, breakage, fragment):
    folder = str(_model_folder(tmp_path, breakage))
    commands = [["profile", *TINY, "--model", folder],
                ["footprint", "--model", folder, "--precision", "fp32", "--device", "cpu"],
                ["numerics", "--model", folder, "--device", "cpu", "--seq-len", "8"]]
    for argv in commands:
        assert main(argv) == 2, argv
        line = _error_line(capsys)
        assert fragment in line, (argv, line)
        assert "upgrade" not in line.lower() and "pip install" not in line


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--lr", "inf"], "--lr"),
        (["--lr", "nan"], "--lr"),
        (["--init-scale", "inf"], "--init-scale"),
        (["--init-scale", "-inf"], "--init-scale"),
    ],
)
def test_non_finite_numbers_are_refused(args, fragment, capsys):
    assert main(["profile", *TINY, *args]) == 2
    assert fragment in _error_line(capsys)


def test_numerics_refuses_csv_and_out_refuses_a_folder(tmp_path, capsys):
    assert main(["numerics", "--model", "tiny", "--out", str(tmp_path / "n.csv")]) == 2
    assert "CSV holds training steps" in _error_line(capsys)
    assert main(["profile", *TINY, "--out", str(tmp_path)]) == 2
    assert "is a folder" in _error_line(capsys)
    folder_json = tmp_path / "looks.json"
    folder_json.mkdir()
    assert main(["profile", *TINY, "--out", str(folder_json)]) == 2
    assert "is a folder" in _error_line(capsys)
    assert not list(folder_json.iterdir())


def test_symlinked_out_is_written_through_and_stale_temps_are_removed(tmp_path, capsys):
    import subprocess as sp

    reports = tmp_path / "reports"
    reports.mkdir()
    target = reports / "real.json"
    link = tmp_path / "link.json"
    link.symlink_to(target)
    dead = sp.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a writer that is gone left its temporary file behind
    stale = reports / f".real.json.{dead.pid}.abc123.ampscope-tmp"
    stale.write_text("half a report")
    assert main(["profile", *TINY, "--out", str(link)]) == 0
    capsys.readouterr()
    assert link.is_symlink() and json.loads(target.read_text())["trials"]
    assert not stale.exists()
    assert sorted(p.name for p in reports.iterdir()) == ["real.json"]


def test_report_command_reads_journals_and_refuses_what_is_not_one(tmp_path, capsys):
    from engine.record.journal import runs_dir

    assert main(["profile", *TINY, "--precision", "fp32"]) == 0
    capsys.readouterr()
    journal = max(runs_dir().glob("*.jsonl"), key=lambda p: p.stat().st_mtime)
    assert main(["report", str(journal), "--out", str(tmp_path / "r.json")]) == 0
    assert "(ok) written to" in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text())["run_id"] == journal.stem
    assert main(["report", str(tmp_path / "r.json"), "--out", str(tmp_path / "r.html")]) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "x.json")]) == 2
    assert "not found" in _error_line(capsys)
    assert main(["report", str(journal), "--out", str(tmp_path / "x.pdf")]) == 2
    assert ".pdf" in _error_line(capsys)
