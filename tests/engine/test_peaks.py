import re

import pytest

from engine.peaks import PeakLookup, mfu, peak_flops, table
from engine.recipes import RECIPES

# (name as nvidia-smi prints it, table entry, dtype, dense TFLOP/s)
NVIDIA_SMI_NAMES = [
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5", "bf16", 989.4),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe", "fp16", 756),
    ("NVIDIA H100 NVL", "NVIDIA H100 NVL", "fp8", 1670.5),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 SXM4", "tf32", 156),
    ("NVIDIA A100 80GB PCIe", "NVIDIA A100 PCIe", "bf16", 312),
    ("NVIDIA A100-PCIE-40GB", "NVIDIA A100 PCIe", "fp32", 19.5),
    ("NVIDIA H200", "NVIDIA H200 SXM", "fp8", 1978.9),
    ("Tesla T4", "NVIDIA T4", "fp16", 65),
    ("Tesla V100-SXM2-16GB", "NVIDIA V100 SXM2", "fp16", 125),
    ("Tesla V100-PCIE-32GB", "NVIDIA V100 PCIe", "fp32", 14),
    ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090", "bf16", 165.2),
    ("NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 3090", "fp16", 71),
    ("NVIDIA A10", "NVIDIA A10", "tf32", 62.5),
    ("NVIDIA L4", "NVIDIA L4", "fp8", 242.5),
    ("NVIDIA L40S", "NVIDIA L40S", "bf16", 362.05),
    ("NVIDIA GH200 480GB", "NVIDIA GH200", "bf16", 989.4),
    ("NVIDIA GH200 144G HBM3e", "NVIDIA GH200", "fp8", 1978.9),
]


@pytest.mark.parametrize(("device", "entry", "dtype", "tflops"), NVIDIA_SMI_NAMES)
def test_nvidia_smi_names_find_their_datasheet(device, entry, dtype, tflops):
    lookup = peak_flops(device, dtype)
    assert lookup.flops_per_s == pytest.approx(tflops * 1e12)
    assert lookup.source.startswith(f"{entry}:") and lookup.reason is None
    matches = [g["name"] for g in table()["gpus"] if re.search(g["match"], device, re.I)]
    assert matches == [entry]  # no second pattern claims the same GPU


@pytest.mark.parametrize("device", ["NVIDIA GeForce GTX 1080", "NVIDIA A10G",
                                    "NVIDIA GeForce RTX 4090 D", "NVIDIA B200"])
def test_unknown_gpu_has_no_peak(device):
    lookup = peak_flops(device, "bf16")
    assert lookup == PeakLookup(None, None, lookup.reason)
    assert f"'{device}'" in lookup.reason and "resources/peak_flops.json" in lookup.reason


@pytest.mark.parametrize("device", [None, "cpu", ""])
def test_cpu_has_no_peak(device):
    lookup = peak_flops(device, "fp32")
    assert lookup.flops_per_s is None and "CPU" in lookup.reason


@pytest.mark.parametrize(("device", "dtype"), [("Tesla T4", "bf16"), ("Tesla T4", "tf32"),
                                               ("NVIDIA A100-SXM4-80GB", "fp8"),
                                               ("Tesla V100-SXM2-32GB", "int8")])
def test_missing_dtype_is_not_borrowed(device, dtype):
    lookup = peak_flops(device, dtype)
    assert lookup.flops_per_s is None and lookup.source is None
    assert dtype in lookup.reason


def test_every_recipe_names_a_column_and_unknown_columns_are_rejected():
    for recipe in RECIPES.values():
        assert recipe.peak_dtype in table()["dtypes"]
    with pytest.raises(ValueError, match="choose from"):
        peak_flops("NVIDIA L4", "fp64")


def test_every_entry_lists_every_column():
    for gpu in table()["gpus"]:
        assert set(gpu["peak_tflops"]) == set(table()["dtypes"]), gpu["name"]
        assert gpu["source"]


def test_mfu_is_a_fraction_of_the_peak():
    lookup = peak_flops("NVIDIA H100 80GB HBM3", "bf16")
    assert mfu(494.7e12, lookup) == pytest.approx(0.5)
    assert mfu(None, lookup) is None
    assert mfu(1e12, peak_flops("Tesla T4", "bf16")) is None


def test_a_mig_slice_gets_the_peak_scaled_by_its_share_of_the_sms():
    # an A100 1g.10gb slice has 14 of the GPU's 108 SMs: 312 TFLOP/s x 14/108
    lookup = peak_flops("NVIDIA A100-SXM4-80GB MIG 1g.10gb", "bf16", sm_count=14, mig=True)
    assert lookup.flops_per_s == pytest.approx(312e12 * 14 / 108)
    assert "14/108 SMs" in lookup.source
    # fewer SMs than the datasheet GPU is a slice even when the name does not say so
    unnamed = peak_flops("NVIDIA H100 80GB HBM3", "fp8", sm_count=66)
    assert unnamed.flops_per_s == pytest.approx(1978.9e12 / 2)


def test_a_mig_slice_with_an_unknown_sm_count_has_no_peak():
    lookup = peak_flops("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "bf16", mig=True)
    assert lookup.flops_per_s is None and "MIG" in lookup.reason


def test_the_whole_gpu_keeps_its_datasheet_peak():
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16", sm_count=132).flops_per_s == (
        pytest.approx(989.4e12))
