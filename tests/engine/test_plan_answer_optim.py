"""The plan's answer plans its 4-bit AdamW lever (torchao's AdamW4bit, a per-recipe
optimiser: 'RECIPE+adamw4bit'), through the command line's parser and handler, on two model
families."""

import json

import pytest

from tests.cli_in_process import run_cli
from tests.engine.families import FAMILIES

CARD = "NVIDIA GeForce RTX 4090"
CARD_BYTES = 24563 * 2**20  # the 4090's total as CUDA reports it (resources/peak_flops.json)
ASK = ("--batch-size", "1", "--seq-len", "32", "--card", "RTX 4090", "--max-batch", "0",
       "--no-history", "--grad-checkpointing", "--json", "--quiet")


def _plan(model: str, *args) -> dict:
    # the command's own parser and handler in this process: the subject is its figures
    run = run_cli("plan", "--model", model, *ASK, *args)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def _peak(model: str, *args) -> int:
    return _plan(model, "--no-levers", *args)["trials"][0]["memory"]["total_bytes"]


def _size(value: int) -> str:  # the answer's tried lines
    return f"{value / 2**30:.2f} GiB" if abs(value) >= 2**30 else f"{value / 2**20:.0f} MiB"


@pytest.mark.parametrize("family", ["llama-gqa", "qwen2"])
def test_cli_answer_plans_the_4bit_adamw_lever(tmp_path, family):
    """A card 64 KiB short of the step with either low-bit AdamW: both levers are planned
    (not refused as an unknown optimizer), each short by what planning it directly says."""
    FAMILIES[family]().save_pretrained(tmp_path / family)
    model = str(tmp_path / family)
    eight = _peak(model, "--precision", "fp32", "--optimizer", "adamw8bit")
    four = _peak(model, "--precision", "fp32+adamw4bit")
    usable = min(eight, four) - 2**16
    data = _plan(model, "--precision", "fp32", "--cuda-context", str(CARD_BYTES - usable))
    tried = data["answers"][0]["tried"]
    assert (f"fp32 with 8-bit AdamW (--optimizer adamw8bit): short by {_size(eight - usable)}"
            " (traced)") in tried, tried
    assert (f"fp32 with 4-bit AdamW (--precision fp32+adamw4bit): short by "
            f"{_size(four - usable)} (traced)") in tried, tried
