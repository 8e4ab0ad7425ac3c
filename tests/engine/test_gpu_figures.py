"""Figures a GPU run would get wrong, checked where they are produced, on the CPU.

Each test feeds the call site (the trial, the Recorder, fit) what real hardware returns
and checks the figure against a computation of its own.
"""

import dataclasses

from engine.config import RunConfig
from engine.device import probe
from engine.models import load_model
from engine.trial import run_trial

CPU = probe("cpu")


def _config(**kw):
    base = dict(model="tiny", batch_size=2, seq_len=32, steps=2, warmup=0, device="cpu",
                isolation="inline", profile_step=False)
    base.update(kw)
    return RunConfig(**base)


# --- fp8 FLOPs are filed under fp8 -----------------------------------------------------


def test_an_fp8_trial_files_its_float8_matmuls_under_fp8():
    from torchao.float8.float8_linear import Float8Linear

    config = _config(batch_size=1, seq_len=16, steps=1)
    fp8_device = dataclasses.replace(CPU, unsupported={}, fp8_supported=True)
    result = run_trial(config, "fp8", fp8_device, lambda e: None, lambda: False)
    assert result.status == "ok", result.reason
    # every converted Linear multiplies in float8 three times per step (forward, input
    # gradient, weight gradient): 2 FLOPs per weight and token each
    model = load_model("tiny", "fp8", "cpu", 0).model
    fp8_weights = sum(m.in_features * m.out_features for m in model.modules()
                      if isinstance(m, Float8Linear))
    assert fp8_weights > 0
    by_dtype = result.flops.by_peak_dtype
    assert by_dtype.get("fp8") == 6 * config.tokens_per_step * fp8_weights
    assert sum(by_dtype.values()) == result.flops.counted_per_step
