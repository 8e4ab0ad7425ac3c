"""``python3 main.py plan`` refuses, before tracing, what this machine cannot finish (issue
#32): a config with a million layers, an FSDP2 world of a million ranks."""

import json
import re
import subprocess
import sys

from tests.engine.test_trainer_callback import ROOT

GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_head": 2, "vocab_size": 1000,
        "n_positions": 128, "bos_token_id": 0, "eos_token_id": 0}


def _plan(*args):
    return subprocess.run([sys.executable, "main.py", "plan", "--seq-len", "64", "--no-history",
                           "--quiet", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def _error_lines(done) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("ampscope: error")]


def test_a_million_layers_is_refused_with_the_estimate_and_what_to_do(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**GPT2, "n_layer": 1_000_000}))
    # traced whole: a plan scaled from a few layers (the default) traces only those
    done = _plan("--model", str(tmp_path), "--full-trace")
    assert done.returncode == 2
    (line,) = _error_lines(done)
    assert "a model of 1,000,000 layers cannot be planned here" in line
    found = re.search(r"at least ([\d,.]+) GiB .* \(([\d,.]+) GiB available\) and ([\d,]+) s "
                      r".*\(([\d,.]+) KiB and ([\d,.]+) ms per layer\); plan the model with at "
                      r"most ([\d,]+) layers", line)
    assert found, line
    need_gib, free_gib, need_s, kib, ms, most = (float(x.replace(",", ""))
                                                for x in found.groups())
    # the estimate is the per-layer cost times the layers (to the rounding shown)
    assert need_gib * 2**30 >= 0.99 * (1_000_000 - 2) * kib * 2**10 - 2**30
    assert need_gib > free_gib or need_s > 600
    assert 1 <= most < 1_000_000
    assert "Traceback" not in done.stderr


def test_an_fsdp2_world_larger_than_the_models_rows_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**GPT2, "n_layer": 2}))
    done = _plan("--model", str(tmp_path), "--strategy", "fsdp2",
                 "--nproc-per-node", "1000000")
    assert done.returncode == 2
    (line,) = _error_lines(done)
    # the largest parameter: the token embedding, vocab_size rows
    assert "--nproc-per-node 1,000,000 is more ranks than" in line and "(1,000)" in line
    assert "plan at most 1,000 ranks" in line
