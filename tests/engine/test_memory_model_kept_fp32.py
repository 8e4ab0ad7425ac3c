"""Layers a half-precision load keeps in fp32 (transformers' _keep_in_fp32_modules: T5's
``wo`` under fp16, not under bf16), loaded as a run loads a config without weights: from
the run's fp32 initial weights through from_pretrained (engine.models.initial_weights)."""

import pytest
import transformers

from engine.core.config import RunConfig
from engine.measure.device import probe
from engine.models import initial_weights
from engine.models.load import dims, load_model
from engine.models.memory_model import shape_of
from engine.run.trial import run_trial
from tests.engine.families import FAMILIES, F, H

WO = 4 * H * F  # the wo of T5's two encoder and two decoder layers


def _weights(tmp_path, family) -> tuple[str, str]:
    FAMILIES[family]().save_pretrained(tmp_path / "config")
    folder = initial_weights.write(str(tmp_path / "config"), 0, False, tmp_path / "weights")
    return str(tmp_path / "config"), str(folder)


@pytest.mark.parametrize(("precision", "kept"), [("fp16", WO), ("bf16", 0)])
def test_the_shape_counts_what_the_load_kept(tmp_path, precision, kept):
    source, weights = _weights(tmp_path, "t5")
    for folder, expected in ((weights, kept), (source, 0)):  # from_config keeps none
        model = load_model(folder, precision, "cpu").model
        shape = shape_of(model, model.config, dims(model.config))
        assert shape.fp32_kept_params == expected, folder


@pytest.mark.parametrize(("family", "batch", "seq", "checkpointing"), [
    ("t5", 2, 32, False), ("t5", 2, 32, True), ("t5", 4, 64, False), ("t5", 4, 64, True),
    ("bart", 4, 64, True)])
def test_pure_fp16_encoder_decoder_peak_within_3_pct(tmp_path, family, batch, seq,
                                                    checkpointing):
    # before: -10.6% at 2 x 32 and -9.3% checkpointed (every wo at 2 bytes in the weights,
    # gradients and AdamW's state; the checkpointed layers' inputs in fp16); then -2.9%,
    # -4.9% at 4 x 64 (wo's fp32 input copy not counted) and -9.8% checkpointed at 4 x 64
    # (the peak is the rerun of the decoder's first layer, inside its attention: score
    # tensors, T5's softmax in fp32). BART, an encoder-decoder without kept layers, reruns the same
    # way and stays within the bound.
    source, weights = _weights(tmp_path, family)
    config = RunConfig(model=source, batch_size=batch, seq_len=seq, steps=1, warmup=0,
                       device="cpu", isolation="inline", grad_checkpointing=checkpointing,
                       profile_step=False, initial_weights=weights)
    result = run_trial(config, "fp16", probe("cpu"), lambda e: None, lambda: False)
    assert result.status == "ok", result.reason
    predicted, errors = result.predicted_memory, result.predicted_memory.error_pct
    assert predicted.params_bytes == result.memory.params_bytes
    # AdamW's per-tensor step counters (4 B each, BART has more tensors) are not predicted
    assert abs(errors["grads"]) < 0.01 and abs(errors["optimizer"]) < 0.05, errors
    assert abs(errors["total"]) <= 3.0, errors


@pytest.mark.parametrize("family", ["t5", "mt5"])
def test_the_kept_input_width_is_every_kept_linear_layers(tmp_path, family):
    # an mT5 keeps the same wo in fp32 under its own model type: counted from the config
    # (encoder and decoder layers, each wo d_ff wide at its input)
    config = FAMILIES["t5"]().to_dict()
    config.pop("model_type", None)
    made = (transformers.MT5Config if family == "mt5" else transformers.T5Config)(**config)
    made.save_pretrained(tmp_path / "config")
    folder = initial_weights.write(str(tmp_path / "config"), 0, False, tmp_path / "weights")
    model = load_model(str(folder), "fp16", "cpu").model
    shape = shape_of(model, model.config, dims(model.config))
    assert model.config.model_type == family
    assert shape.fp32_kept_in_features == (made.num_layers + made.num_decoder_layers) * made.d_ff
    assert shape.fp32_kept_params == WO


def test_a_family_without_kept_layers_is_unchanged(tmp_path):
    source, weights = _weights(tmp_path, "gpt2")
    config = RunConfig(model=source, batch_size=2, seq_len=32, steps=1, warmup=0,
                       device="cpu", isolation="inline", profile_step=False,
                       initial_weights=weights)
    result = run_trial(config, "fp16", probe("cpu"), lambda e: None, lambda: False)
    assert result.predicted_memory.total_bytes == 2_414_933  # docs/memory-model.md's row
