import pytest

from engine.core.config import RunConfig, parse_precisions


def test_parse_precisions_keeps_order_and_normalises():
    assert parse_precisions(" FP32, bf16-amp ,fp16 ") == ("fp32", "bf16-amp", "fp16")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("fp33", "unknown precision 'fp33'"), ("", "no precision"), ("fp32,fp32", "twice")],
)
def test_bad_precisions_say_what_to_do(text, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_precisions(text)


@pytest.mark.parametrize(
    ("field", "value", "flag"),
    [("batch_size", 0, "--batch-size"), ("steps", -1, "--steps"), ("seq_len", 0, "--seq-len"),
     ("grad_accum", 0, "--grad-accum"), ("warmup", -1, "--warmup"), ("lr", 0.0, "--lr"),
     ("init_scale", 0.0, "--init-scale")],
)
def test_config_rejects_bad_numbers_naming_the_flag(field, value, flag):
    with pytest.raises(ValueError, match=flag):
        RunConfig(**{field: value})


def test_config_rejects_unknown_device_and_optimizer():
    with pytest.raises(ValueError, match="cuda:N"):
        RunConfig(device="tpu")
    with pytest.raises(ValueError, match="adamw"):
        RunConfig(optimizer="lion")


def test_config_round_trips_through_dict():
    config = RunConfig(model="gpt2", precisions=("fp32", "nf4"), batch_size=3, device="CUDA:1")
    assert config.device == "cuda:1"
    assert RunConfig.from_dict(config.to_dict()) == config
    assert config.tokens_per_step == 3 * 128
