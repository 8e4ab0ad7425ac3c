"""Which card an ':auto' recipe weighs on a GPU, fed with the real H200 run's device name:
the GPU itself unless --card names another, and a GPU the peaks table lacks is refused with
the flag to pass. GPT-2 small at 8 x 1024 keeps every layer in bf16 on the H200, as its
compiled fp8 run measured a loss (31.4 ms against bf16-amp's 23.4)."""

import gzip
import json

from transformers import GPT2Config, GPT2LMHeadModel
from transformers.pytorch_utils import Conv1D

from engine.core.config import RunConfig
from engine.run.fp8_auto import card_reason, choose
from tests.engine.test_h200_reports import REPORTS


def _h200_name() -> str:
    report = json.loads(gzip.decompress((REPORTS / "02-gpt2-bf16-amp.json.gz").read_bytes()))
    return report["environment"]["device"]["name"]


def _config(card=None) -> RunConfig:
    return RunConfig(model="gpt2", precisions=("fp8-rowwise:auto",), batch_size=8,
                     seq_len=1024, device="cuda", payoff_card=card)


def test_the_gpu_it_runs_on_is_the_card_and_gpt2_small_keeps_bf16_on_the_h200():
    name = _h200_name()
    assert name == "NVIDIA H200"
    one_block = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=64, n_head=2))
    projections = 12 * sum(isinstance(m, Conv1D) for m in one_block.modules())  # 12 blocks
    for label in ("fp8:auto", "fp8-rowwise:auto"):
        choice = choose(_config(), label, name, "cuda")
        assert choice.card == "NVIDIA H200 SXM" and choice.card_source == (
            "the GPU this trial ran on")
        assert choice.tokens == 8 * 1024
        assert len(choice.keep_bf16) == projections  # no layer pays
    elsewhere = choose(_config("H100 SXM"), "fp8:auto", name, "cuda")
    assert elsewhere.card == "NVIDIA H100 SXM5"
    assert elsewhere.card_source == f"--card; this trial ran on {name}"


def test_a_gpu_the_table_lacks_is_refused_with_the_flag_to_pass():
    reason = card_reason("fp8:auto", None, "cuda", "NVIDIA Imaginary 9000")
    assert "(the GPU this trial runs on)" in reason and "--card" in reason
    assert card_reason("fp8:auto", None, "cuda", _h200_name()) is None
