"""The precisions a run compares when none are named: the CLI's without a device, and in the
window those the probed device runs natively (fp32 always, with an autocast recipe)."""

from __future__ import annotations

import pytest

from engine.cli import build_parser
from engine.core.config import DEFAULT_PRECISIONS, default_precisions, parse_precisions
from engine.measure import gating
from engine.measure.device import DeviceInfo


def _device(description: gating.DeviceDescription, bf16_hardware: bool | None) -> DeviceInfo:
    verdicts = gating.matrix(description)
    unsupported = {p: v.reason for p, v in verdicts.items() if v.support == "unsupported"}
    return DeviceInfo(kind="cpu" if description.kind == "cpu" else "cuda", index=None,
                      name=description.name, compute_capability=description.compute_capability,
                      total_memory_bytes=None, cuda_version=None, driver_version=None,
                      nvml_available=False, bf16_supported="bf16" not in unsupported,
                      tf32_supported=False, fp8_supported=False, unsupported=unsupported,
                      bf16_hardware=bf16_hardware, verdicts=verdicts)


def test_the_cli_profiles_the_default_precisions():
    args = build_parser().parse_args(["profile"])
    assert parse_precisions(args.precision) == DEFAULT_PRECISIONS == default_precisions()


@pytest.mark.parametrize(("description", "bf16_hardware", "expected"), [
    (gating.DeviceDescription("cuda", "H100", compute_capability=(9, 0)), True,
     ("fp32", "bf16-amp", "fp16-amp")),
    # Turing: no bf16 Tensor Cores, fp16 autocast only
    (gating.DeviceDescription("cuda", "T4", compute_capability=(7, 5)), False,
     ("fp32", "fp16-amp")),
    (gating.CPU, True, ("fp32", "bf16-amp", "fp16-amp")),
    # a CPU without AVX512-BF16/AMX emulates bf16 in fp32: slower than fp32, left out
    (gating.CPU, False, ("fp32", "fp16-amp")),
    (gating.CPU, None, ("fp32", "bf16-amp", "fp16-amp")),  # not known: the probe's verdict
])
def test_a_probed_device_gets_fp32_and_the_autocast_recipes_it_runs_natively(
        description, bf16_hardware, expected):
    assert default_precisions(_device(description, bf16_hardware)) == expected
