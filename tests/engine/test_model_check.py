"""The window's fast model checks agree with the run preflight, without loading torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine.core.config import RunConfig
from engine.models.model_check import check_model
from engine.run.runner import preflight


def _verdict(fn):
    try:
        fn()
        return None
    except ValueError as exc:
        return str(exc)


def _folder(tmp_path, **config):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 64,
         **config}))
    return folder


@pytest.mark.parametrize("seq_len", [16, 512, 513])
def test_preset_position_limit_agrees_with_the_preflight(seq_len):
    config = RunConfig(model="tiny", seq_len=seq_len, device="cpu")
    fast = _verdict(lambda: check_model("tiny", seq_len, "preset"))
    slow = _verdict(lambda: preflight(config))
    assert fast == slow
    assert (fast is None) == (seq_len <= 512)


@pytest.mark.parametrize("seq_len", [32, 33])
def test_folder_position_limit_agrees_with_the_preflight(tmp_path, seq_len):
    folder = _folder(tmp_path, n_positions=32)
    config = RunConfig(model=str(folder), seq_len=seq_len, device="cpu")
    fast = _verdict(lambda: check_model(str(folder), seq_len, "folder"))
    slow = _verdict(lambda: preflight(config))
    assert fast == slow
    assert (fast is None) == (seq_len <= 32)


def test_missing_folder_and_folder_without_config(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        check_model(str(tmp_path / "nope"), 8, "folder")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has no config.json"):
        check_model(str(tmp_path / "empty"), 8, "folder")
    with pytest.raises(ValueError, match="has no config.json"):
        preflight(RunConfig(model=str(tmp_path / "empty"), device="cpu"))


def test_hub_id_not_in_the_cache():
    with pytest.raises(ValueError, match="not in the local hub cache"):
        check_model("no-such-org/no-such-model", 8, "hub")


def test_the_check_does_not_load_torch():
    code = ("import sys; from engine.models.model_check import check_model; "
            "check_model('tiny', 16); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"
