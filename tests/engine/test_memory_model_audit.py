"""What the independent audit of issue 29 found on the CPU, held out from every fit: each
against the tracker's measurement in a real trial (or the loaded model's own tensors),
with the expected figure computed here by hand."""

import math

import pytest

from engine.core.config import RunConfig
from engine.measure.device import probe
from engine.measure.memtrack import quant_state_tensors, unique_bytes
from engine.models.load import load_model
from engine.run.trial import run_trial
from tests.engine.families import FAMILIES, H, V


def _trial(tmp_path, family, precision, batch, seq, checkpointing):
    FAMILIES[family]().save_pretrained(tmp_path)
    config = RunConfig(model=str(tmp_path), batch_size=batch, seq_len=seq, steps=1, warmup=0,
                       device="cpu", isolation="inline", grad_checkpointing=checkpointing,
                       profile_step=False)
    result = run_trial(config, precision, probe("cpu"), lambda e: None, lambda: False)
    assert result.status == "ok", result.reason
    return result


@pytest.mark.parametrize("family", ["t5", "bart", "llama-gqa"])
def test_nf4_quantisation_state_counts_each_weights_code_book(tmp_path, family):
    # the audit: predicted 17-18% short on T5 and BART (the per-weight code books missing)
    FAMILIES[family]().save_pretrained(tmp_path)
    model = load_model(str(tmp_path), "nf4", "cpu").model
    packed = [p for p in model.parameters() if type(p).__name__ == "Params4bit"]
    by_hand = sum(math.ceil(p.quant_state.shape.numel() / 64) * 4 + 16 * 4 for p in packed)
    assert unique_bytes(quant_state_tensors(model)) == by_hand
    result = _trial(tmp_path / "run", family, "nf4", 2, 16, False)
    assert result.predicted_memory.quant_state_bytes == by_hand == result.memory.quant_state_bytes


@pytest.mark.parametrize(("family", "outside"), [
    ("bert", V * H + H * H),  # the MLM head's decoder and its transform Linear
    ("gpt2", V * H),  # the LM head only
])
def test_checkpointed_autocast_keeps_the_copies_of_every_weight_outside_the_layers(
        tmp_path, family, outside):
    # the audit: BERT's weight copies 11.3% low with checkpointing (the transform missing)
    result = _trial(tmp_path, family, "bf16-amp", 4, 128, True)
    measured = result.memory.at_phase_start_bytes["backward"]["weight_copies"]
    assert measured == 2 * outside == result.predicted_memory.weight_copies_bytes
    assert abs(result.predicted_memory.error_pct["total"]) <= 1.0


@pytest.mark.parametrize("family", ["gpt2", "gpt-neox"])
def test_activations_calibrated_without_the_key_value_cache(tmp_path, family):
    # trials load with use_cache off; the calibration ran with it on, which kept GPT-2 a
    # copy of each layer's keys and values more (+8.6% saved) and GPT-NeoX one less
    # (-10.4%): at 4 x 128 (the calibration's sequences end at 64), fp32 and autocast
    for precision in ("fp32", "bf16-amp"):
        result = _trial(tmp_path / precision, family, precision, 4, 128, False)
        assert abs(result.predicted_memory.error_pct["activations"]) <= 1.5, precision
        assert abs(result.predicted_memory.error_pct["total"]) <= 1.0, precision


@pytest.mark.parametrize("precision", ["nf4", "int8"])
def test_t5_over_a_k_bit_base_at_a_longer_sequence(tmp_path, precision):
    # the audit: T5 nf4 at 4 x 128 +20.3% (activations +37.8%). T5's relative position
    # bias is made once for the whole batch (heads x sequence^2), and over a k-bit base
    # its attention keeps fewer score bytes than under plain autocast: both are fitted
    # terms now (at 2 x 32 and 4 x 64); 4 x 128 is held out
    result = _trial(tmp_path, "t5", precision, 4, 128, False)
    errors = result.predicted_memory.error_pct
    assert abs(errors["activations"]) <= 5.0 and abs(errors["total"]) <= 3.0, errors


@pytest.mark.parametrize("precision", ["int8", "nf4"])
@pytest.mark.parametrize("family", ["llama-gqa", "bert"])
def test_checkpointed_k_bit_base_keeps_its_own_logits_outside_the_layers(tmp_path, family,
                                                                        precision):
    # the audit: Llama int8/nf4 with checkpointing, activations +13.3% (+15.8% here before:
    # what a k-bit base keeps outside the layers is not autocast's; BERT's was -11%).
    # With checkpointing the layers keep their inputs only, fp32 over a k-bit base
    # (b x s x hidden x 4 each, beside the CPU generator's state): the rest is outside
    result = _trial(tmp_path, family, precision, 4, 128, True)
    saved = result.memory.at_phase_start_bytes["backward"]["activations"]
    inputs = 2 * (4 * 128 * H * 4 + 5056)
    assert inputs < saved
    errors = result.predicted_memory.error_pct
    assert abs(errors["activations"]) <= 3.0 and abs(errors["total"]) <= 2.0, errors
