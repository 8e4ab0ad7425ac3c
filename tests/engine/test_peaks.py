import re

import pytest

from engine.core.recipes import RECIPES
from engine.measure.peaks import PeakLookup, mfu, peak_flops, table

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
                                    "NVIDIA GeForce RTX 4090 D", "NVIDIA GeForce RTX 5080",
                                    "NVIDIA GeForce RTX 4080 SUPER", "NVIDIA H800 PCIe",
                                    "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"])
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
        # a reason stands only beside a missing figure, never beside one that is given
        for dtype in gpu.get("null_reasons", {}):
            assert gpu["peak_tflops"][dtype] is None, (gpu["name"], dtype)


# Datasheet figures as the datasheets print them, turned into dense TFLOP/s here:
# NVIDIA prints Blackwell rates with 2:4 sparsity (dense is half), in PFLOP/s per GPU.
BLACKWELL_AND_NEWER = [
    # (name as the driver reports it, table entry, dtype, dense TFLOP/s)
    ("NVIDIA B200", "NVIDIA B200", "bf16", 4.5e3 / 2),  # HGX B200: 4.5 PFLOPS sparse
    ("NVIDIA B200", "NVIDIA B200", "fp8", 9e3 / 2),  # 9 PFLOPS sparse
    ("NVIDIA B200", "NVIDIA B200", "nvfp4", 18e3 / 2),  # FP4 18 PFLOPS sparse
    ("NVIDIA GB200", "NVIDIA GB200", "fp4", 20e3 / 2),  # GB200 NVL72 per GPU
    ("NVIDIA GB200", "NVIDIA GB200", "tf32", 2.5e3 / 2),
    ("NVIDIA GB300", "NVIDIA GB300", "nvfp4", 15e3),  # Blackwell Ultra, dense as printed
    ("NVIDIA B300 SXM6 AC", "NVIDIA B300", "fp8", 4.5e3),
    # RTX 5090: FP16 838 TFLOPS sparse with fp16 accumulate; GeForce fp32 accumulate is half
    ("NVIDIA GeForce RTX 5090", "NVIDIA GeForce RTX 5090", "fp16", 838 / 2 / 2),
    ("NVIDIA GeForce RTX 5090", "NVIDIA GeForce RTX 5090", "fp4", 3352 / 2),
    ("NVIDIA GeForce RTX 5090", "NVIDIA GeForce RTX 5090", "mxfp8", 838 / 2),  # fp32 acc
    ("NVIDIA GeForce RTX 4080", "NVIDIA GeForce RTX 4080", "bf16", 97.5),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "NVIDIA RTX PRO 6000 Blackwell",
     "fp32", 125),
    ("NVIDIA A40", "NVIDIA A40", "tf32", 149.6 / 2),  # A40: TF32 149.6 sparse
    ("NVIDIA A30", "NVIDIA A30", "bf16", 330 / 2),
    ("NVIDIA L20", "NVIDIA L20", "fp8", 478 / 2),
    ("NVIDIA H800", "NVIDIA H800 SXM", "bf16", 1979 / 2),  # H100 SXM5's 1,979 sparse
    ("NVIDIA H20", "NVIDIA H20", "bf16", 148),
    ("AMD Instinct MI300X", "AMD Instinct MI300X", "fp8", 2614.9),
    ("AMD Instinct MI325X", "AMD Instinct MI325X", "bf16", 1307.4),
    ("AMD Instinct MI355X", "AMD Instinct MI355X", "fp8", 5e3),
    # AMD's MI355X page: BF16 2.5 PFLOPS dense (5.0 sparse), MXFP4 10.1 dense as printed
    ("AMD Instinct MI355X", "AMD Instinct MI355X", "bf16", 5.0e3 / 2),
    ("AMD Instinct MI355X", "AMD Instinct MI355X", "fp4", 10.1e3),
    ("AMD Instinct MI355X", "AMD Instinct MI355X", "mxfp8", 5e3),
    ("NVIDIA B300 SXM6 AC", "NVIDIA B300", "nvfp4", 14e3),  # Blackwell Ultra datasheet, dense
    ("NVIDIA GB200", "NVIDIA GB200", "bf16", 5e3 / 2),  # per GPU, 5 PFLOPS sparse
    ("NVIDIA GeForce RTX 5090", "NVIDIA GeForce RTX 5090", "bf16", 209.5),
    ("NVIDIA GeForce RTX 5090", "NVIDIA GeForce RTX 5090", "fp8", 419),
]


@pytest.mark.parametrize(("device", "entry", "dtype", "tflops"), BLACKWELL_AND_NEWER)
def test_new_rows_give_the_datasheet_figure(device, entry, dtype, tflops):
    lookup = peak_flops(device, dtype)
    assert lookup.flops_per_s == pytest.approx(tflops * 1e12, rel=1e-3)
    assert lookup.source.startswith(f"{entry}:") and lookup.reason is None
    matches = [g["name"] for g in table()["gpus"] if re.search(g["match"], device, re.I)]
    assert matches == [entry]


@pytest.mark.parametrize(("device", "dtype", "words"), [
    ("NVIDIA B300 SXM6 AC", "int8", "disagree"),
    ("NVIDIA GB300", "int8", "disagree"),
    ("NVIDIA B300 SXM6 AC", "tf32", "disagree"),
    ("AMD Instinct MI355X", "int8", "not stated"),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "bf16", "publishes no dense bf16"),
])
def test_a_figure_the_sources_do_not_settle_is_na_with_the_reason(device, dtype, words):
    lookup = peak_flops(device, dtype)
    assert lookup.flops_per_s is None and lookup.source is None
    assert words in lookup.reason and "MFU is n/a" in lookup.reason
    assert "hardware path" not in lookup.reason  # not mistaken for a missing instruction


@pytest.mark.parametrize(("device", "dtype"), [("NVIDIA H100 80GB HBM3", "fp4"),
                                               ("NVIDIA L4", "mxfp8"),
                                               ("AMD Instinct MI300X", "nvfp4")])
def test_no_fp4_or_block_scaled_rate_before_blackwell_and_cdna4(device, dtype):
    lookup = peak_flops(device, dtype)
    assert lookup.flops_per_s is None and "hardware path" in lookup.reason


def test_geforce_rows_are_keyed_by_accumulate_type():
    fp32_acc = peak_flops("NVIDIA GeForce RTX 5090", "fp16")
    fp16_acc = peak_flops("NVIDIA GeForce RTX 5090", "fp16", accumulate="fp16")
    assert fp16_acc.flops_per_s == pytest.approx(838e12 / 2)  # the sparse figure halved
    assert fp32_acc.flops_per_s == pytest.approx(fp16_acc.flops_per_s / 2)
    assert "fp32 accumulate" in fp32_acc.source and "fp16 accumulate" in fp16_acc.source
    assert peak_flops("NVIDIA GeForce RTX 4080", "fp8", accumulate="fp16").flops_per_s == (
        pytest.approx(389.9e12))
    geforce = [g for g in table()["gpus"] if "GeForce" in g["name"]]
    assert geforce and all(g.get("accumulate") == "fp32" for g in geforce)
    with pytest.raises(ValueError, match="accumulate"):
        peak_flops("NVIDIA GeForce RTX 5090", "fp16", accumulate="fp8")


def test_new_rows_carry_their_unit_count_and_memory():
    rows = {g["name"]: g for g in table()["gpus"]}
    assert rows["NVIDIA B200"]["sm_count"] == 148
    assert rows["AMD Instinct MI300X"]["sm_count"] == 304  # compute units
    assert rows["NVIDIA GeForce RTX 5090"]["sm_count"] == 170
    for name in ("NVIDIA B200", "NVIDIA GB300", "AMD Instinct MI355X"):
        row = rows[name]
        assert row["memory_bytes"] == row["memory_nominal_gb"] * 2**30
        assert row["memory_kind"] == "datasheet"


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


def test_a_b200_mig_slice_is_scaled_by_its_sms():
    lookup = peak_flops("NVIDIA B200 MIG 1g.23gb", "fp8", sm_count=16, mig=True)
    assert lookup.flops_per_s == pytest.approx(4.5e15 * 16 / 148)


def test_a_blackwell_ultra_mig_slice_is_na_while_its_sm_count_is_disputed():
    lookup = peak_flops("NVIDIA B300 SXM6 AC MIG 1g.34gb", "fp8", sm_count=18, mig=True)
    assert lookup.flops_per_s is None and "MIG" in lookup.reason
    row = next(g for g in table()["gpus"] if g["name"] == "NVIDIA B300")
    assert row["sm_count"] is None and "disagree" in row["sm_count_note"]


def test_the_whole_gpu_keeps_its_datasheet_peak():
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16", sm_count=132).flops_per_s == (
        pytest.approx(989.4e12))


def test_every_card_has_a_memory_size_with_its_source():
    """Every row: CUDA's total with its source, or a nominal size with its note and
    source, or sizes per variant; fit's cards and plan's verdicts read the same table."""
    from engine.measure.peaks import card_memory
    from engine.run.fit import CARDS
    from engine.run.plan import PlanConfig, plan

    for row in table()["gpus"]:
        sizes = row.get("memory_variants") or [row]
        for size in sizes:  # no row lacks it: a printout of CUDA's total, or the datasheet's
            assert isinstance(size["memory_bytes"], int) and size["memory_bytes"] > 0, row
            assert size["memory_kind"] in ("cuda", "datasheet"), row["name"]
            if size["memory_kind"] == "cuda":
                assert "total" in size["memory_source"].lower(), row["name"]
                assert f"{size['memory_bytes'] // 2**20} MiB" in size["memory_source"]
            else:  # the datasheet named beside its nominal figure, in CUDA's unit (bytes)
                assert size["memory_bytes"] == size["memory_nominal_gb"] * 2**30, row["name"]
                assert "datasheet" in size["memory_source"], row["name"]
                assert "CUDA reports less" in size["memory_source"], row["name"]
    # the sizes fit's columns had as torch printed them (MiB, rounded down)
    assert [c.capacity_bytes // 2**20 for c in CARDS] == [24563, 40536, 45589, 81090, 143156]
    assert card_memory("NVIDIA A100-SXM4-40GB").memory_bytes == 40536 * 2**20
    a100 = card_memory("NVIDIA A100-SXM4")
    assert a100.memory_bytes is None and "40GB or 80GB" in a100.source
    assert card_memory("Tesla T4").memory_bytes == 14930 * 2**20  # a printout, ECC on
    assert card_memory("NVIDIA GeForce RTX 3090").memory_bytes == 24259 * 2**20
    assert card_memory("NVIDIA A10").kind == "datasheet"
    # plan: the usable memory is the same table's figure less the context allowance
    config = PlanConfig(model="tiny", precisions=("fp32",), batch_size=1, seq_len=16,
                        cards=("L40S", "A100-SXM4-40GB"), max_batch=0)
    l40s, a100_40 = plan(config).trials[0].cards
    assert l40s.usable_bytes == 45589 * 2**20 - 2**30
    assert a100_40.card == "NVIDIA A100 SXM4 40GB"
    assert a100_40.usable_bytes == 40536 * 2**20 - 2**30
