import json

import pytest

from engine.numerics.lab import format_lab_text, run_lab


@pytest.fixture(scope="module")
def lab():
    return run_lab("tiny", "fp16-amp", device="cpu", batch_size=1, seq_len=16)


def test_lab_is_strict_json_with_every_section(lab):
    text = json.dumps(lab, allow_nan=False)  # the fp16 torch.sum demo's inf is a string
    assert json.loads(text) == lab
    for key in ("formats", "demos", "gradients", "activations", "op_trace", "mfu_dtype_mix",
                "advice", "device"):
        assert lab[key]
    assert lab["gradients"]["backward_scale"] == 2.0**16
    assert lab["model_dims"]["hidden"] == 128


def test_lab_on_cpu_has_no_peak_and_says_why(lab):
    assert lab["mfu_dtype_mix"]["flops_per_s"] is None
    assert "CPU" in lab["mfu_dtype_mix"]["reason"]
    assert lab["advice"]["recommended"] == "fp32"
    assert "n/a (" in format_lab_text(lab)


def test_lab_text_has_each_section(lab):
    text = format_lab_text(lab)
    for heading in ("Number formats", "Live demos", "Gradients", "Activations", "Op trace",
                    "Advice: fp32"):
        assert heading in text
    assert "1 + 0.0001" in text and "swallowed" in text


def test_lab_rejects_a_precision_the_device_cannot_run():
    with pytest.raises(ValueError, match="tf32"):
        run_lab("tiny", "tf32", device="cpu", seq_len=8)


def test_lab_rejects_bad_input_with_the_flag_to_fix():
    with pytest.raises(ValueError, match="--seq-len"):
        run_lab("tiny", "fp32", device="cpu", seq_len=0)
