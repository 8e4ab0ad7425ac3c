"""Datasheet peak FLOP/s per GPU and dtype, the denominator of MFU.

The table lives in ``resources/peak_flops.json`` (its ``convention`` says what the
numbers mean). A GPU it does not name, a CPU, or a dtype the GPU lacks gives no
peak and a reason; the lookup never borrows another GPU's or another dtype's figure.
A MIG slice has only some of the GPU's SMs: its peak is the GPU's scaled by its share
of them, or n/a when that share is unknown, never the whole GPU's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache

from engine.core.resources import RESOURCES

TABLE = RESOURCES / "peak_flops.json"
_TABLE_NAME = "resources/peak_flops.json"


@dataclass(frozen=True)
class PeakLookup:
    flops_per_s: float | None
    source: str | None
    reason: str | None  # why flops_per_s is None


@cache
def table() -> dict:
    return json.loads(TABLE.read_text(encoding="utf-8"))


def _entry(device_name: str) -> dict | None:
    for gpu in table()["gpus"]:
        if re.search(gpu["match"], device_name, re.IGNORECASE):
            return gpu
    return None


def _rate(gpu: dict, dtype: str, accumulate: str) -> tuple[float | None, str | None]:
    """The dense rate and, when there is none, why (from the row's ``null_reasons``)."""
    if accumulate == "fp16" and "fp16_accumulate_tflops" in gpu:
        tflops = gpu["fp16_accumulate_tflops"].get(dtype)
        if tflops is None:
            return None, (f"{gpu['name']} has no {dtype} rate with fp16 accumulate in "
                          f"{_TABLE_NAME}, so MFU is n/a")
        return tflops, None
    tflops = gpu["peak_tflops"].get(dtype)
    if tflops is not None:
        return tflops, None
    reason = gpu.get("null_reasons", {}).get(dtype)
    if reason:
        return None, f"{reason}: MFU is n/a"
    return None, (f"{gpu['name']} has no {dtype} peak on its datasheet (no {dtype} "
                  "hardware path), so MFU is n/a")


def peak_flops(device_name: str | None, dtype: str, sm_count: int | None = None,
               mig: bool = False, accumulate: str = "fp32") -> PeakLookup:
    """Peak of ``dtype`` (a column of the table, e.g. a recipe's ``peak_dtype``) on a GPU.

    ``sm_count`` is the device's SM count as CUDA reports it; with ``mig`` (or fewer SMs
    than the datasheet GPU) the peak is scaled by the share of SMs the device has.
    ``accumulate`` picks a GeForce row's fp16-accumulate rates (twice its fp32-accumulate
    ones); every other row has one rate per dtype.
    """
    if accumulate not in ("fp32", "fp16"):
        raise ValueError(f"accumulate must be 'fp32' or 'fp16', not '{accumulate}'")
    dtypes = table()["dtypes"]
    if dtype not in dtypes:
        raise ValueError(f"no peak column '{dtype}': choose from {', '.join(dtypes)}")
    name = (device_name or "").strip()
    if not name or name.lower() == "cpu":
        return PeakLookup(None, None, "no datasheet peak for CPUs: MFU is measured on GPUs only")
    gpu = _entry(name)
    if gpu is None:
        return PeakLookup(
            None, None, f"no datasheet peak for '{name}' in {_TABLE_NAME}: add it to get MFU"
        )
    tflops, reason = _rate(gpu, dtype, accumulate)
    if tflops is None:
        return PeakLookup(None, None, reason)
    unit = "TOPS" if dtype == "int8" else "TFLOP/s"
    acc = f" with {accumulate} accumulate" if "accumulate" in gpu else ""
    source = f"{gpu['name']}: {tflops} {unit} {dtype}{acc}, dense ({gpu['source']})"
    full_sms = gpu.get("sm_count")
    partial = mig or (sm_count is not None and full_sms is not None and sm_count < full_sms)
    if not partial:
        return PeakLookup(tflops * 1e12, source, None)
    if sm_count is None or full_sms is None:
        return PeakLookup(
            None, None, f"'{name}' is a MIG slice of a {gpu['name']} with an unknown share of "
            "its SMs: the whole GPU's peak would overstate it, so MFU is n/a"
        )
    share = sm_count / full_sms
    source += (f", scaled by {sm_count}/{full_sms} SMs for this MIG slice "
               f"= {tflops * share:.4g} {unit}")
    return PeakLookup(tflops * share * 1e12, source, None)


def mfu(achieved_flops_per_s: float | None, lookup: PeakLookup) -> float | None:
    """Model FLOPs utilisation as a fraction of the peak (0.42 means 42%)."""
    if achieved_flops_per_s is None or lookup.flops_per_s is None:
        return None
    return achieved_flops_per_s / lookup.flops_per_s


# one denominator for every recipe on a device, so an MFU column compares like with like
COMMON_DTYPES = ("bf16", "fp16")
COMMON_CONVENTION = (
    "common-reference MFU: model FLOPs / step time / the device's dense 16-bit Tensor Core "
    "peak (bf16; fp16 where the GPU has no bf16), the same denominator for every recipe on "
    "the device, as PaLM and nanoGPT quote MFU. Each recipe's own-peak MFU divides by the "
    "rate of the dtype it ran (fp32 by the CUDA-core rate, 15x lower on an H100), so an fp32 "
    "trial reads as efficient while it is slower; this one ranks as step time does. An fp8 or "
    "int8 recipe may pass 1: its matmuls ran faster than any 16-bit one could")


def common_peak(device_name: str | None, sm_count: int | None = None,
                mig: bool = False) -> PeakLookup:
    """The common MFU denominator (``COMMON_CONVENTION``) of a device; n/a with the reason
    where the device has no 16-bit Tensor Core rate in the table (a CPU, an unknown GPU)."""
    reasons = []
    for dtype in COMMON_DTYPES:
        found = peak_flops(device_name, dtype, sm_count=sm_count, mig=mig)
        if found.flops_per_s is not None:
            return PeakLookup(found.flops_per_s, f"common reference: {found.source}", None)
        reasons.append(found.reason)
    why = reasons[0] if reasons[0] == reasons[-1] else "; ".join(reasons)
    return PeakLookup(None, None, f"no common 16-bit Tensor Core peak: {why}")


@dataclass(frozen=True)
class CardMemory:
    name: str  # the table's name, with the size variant where the GPU comes in several
    memory_bytes: int | None  # as CUDA reports it (total_memory); None: no source gives it
    source: str  # where the figure comes from, or why there is none
    # "cuda": a printout of total_memory; "datasheet": the nominal capacity, more than CUDA's
    kind: str | None = None


def card_memory(card: str) -> CardMemory | None:
    """A card's memory from the table (None: the table does not name the card). A GPU sold
    in several sizes needs the size in the name ("A100-SXM4-40GB")."""
    entry = _entry(card)
    if entry is None:
        return None
    variants = entry.get("memory_variants")
    if variants:
        for v in variants:
            if re.search(v["match"], card, re.IGNORECASE):
                return _card_memory(f"{entry['name']} {v['label']}", v)
        sizes = " or ".join(v["label"] for v in variants)
        return CardMemory(entry["name"], None,
                          f"{entry['name']} comes in {sizes}: add the size to the card name, "
                          f"e.g. '{card} {variants[0]['label']}'")
    return _card_memory(entry["name"], entry)


def _card_memory(name: str, row: dict) -> CardMemory:
    if row.get("memory_bytes") is not None:
        return CardMemory(name, int(row["memory_bytes"]), row["memory_source"],
                          row.get("memory_kind", "cuda"))
    nominal = row.get("memory_nominal_gb")
    known = f" (nominal {nominal} GB: {row.get('memory_note')})" if nominal else ""
    return CardMemory(name, None, f"{name} has no memory size as CUDA reports it in "
                                  f"{_TABLE_NAME}{known}")


@dataclass(frozen=True)
class Bandwidth:
    bytes_per_s: float | None  # the datasheet's peak DRAM bandwidth; None: not known
    source: str  # where the figure comes from, or why there is none


def memory_bandwidth(card: str) -> Bandwidth:
    """A card's datasheet memory bandwidth; a GPU whose sizes differ in bandwidth needs the
    size in the name, as for its memory."""
    entry = _entry(card)
    if entry is None:
        return Bandwidth(None, f"'{card}' is not in {_TABLE_NAME}")
    row = entry
    if entry.get("memory_bandwidth_tbps") is None:
        variants = entry.get("memory_variants") or []
        row = next((v for v in variants if re.search(v["match"], card, re.IGNORECASE)), entry)
    if row.get("memory_bandwidth_tbps") is None:
        return Bandwidth(None, f"{entry['name']}: no memory bandwidth ("
                               f"{row.get('memory_bandwidth_source', 'none in the table')})")
    return Bandwidth(row["memory_bandwidth_tbps"] * 1e12, row["memory_bandwidth_source"])
