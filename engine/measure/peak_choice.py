"""The peak FLOP/s MFU divides by, chosen one way for a profile trial and a user's run.

The datasheet peak of the device's GPU (a MIG slice gets its share of the SMs) for each
dtype the step's matmuls ran in, blended by the FLOPs each ran (the recipe's own dtype
where nothing was counted); the measured matmul peak is blended the same way.
"""

from __future__ import annotations

from engine.core.recipes import Recipe
from engine.measure import flops as flops_mod
from engine.measure.peaks import PeakLookup, peak_flops, table
from engine.measure.peaks import common_peak as _common_peak


def datasheet_peak(info, rec: Recipe, by_peak_dtype: dict) -> PeakLookup:
    """``info``: the DeviceInfo (kind, name, sm_count, mig); ``by_peak_dtype``: counted
    FLOPs per peak-table dtype, empty when they were not counted."""
    if info.kind != "cuda":
        return peak_flops(None, rec.peak_dtype)
    columns = table()["dtypes"]

    def lookup(key: str) -> PeakLookup:
        if key in columns:  # a MIG slice has only some of the SMs the table's peak is for
            return peak_flops(info.name, key, sm_count=info.sm_count, mig=info.mig)
        return PeakLookup(None, None, f"no peak FLOP/s column for {key} matmuls")

    return _blended(lookup, rec, by_peak_dtype)


def measured_peak(measured, rec: Recipe, by_peak_dtype: dict) -> PeakLookup:
    """This machine's measured matmul peak (engine.measure.matmul_peak.MeasuredPeak),
    blended by the step's dtype mix as the datasheet peak is."""
    return _blended(measured.lookup, rec, by_peak_dtype)


def _blended(lookup, rec: Recipe, by_peak_dtype: dict) -> PeakLookup:
    if not by_peak_dtype:
        return lookup(rec.peak_dtype)
    blend = flops_mod.blended_peak(by_peak_dtype, lookup)
    return PeakLookup(blend.flops_per_s, flops_mod.describe_blend(blend), blend.reason)


def common_peak(info) -> PeakLookup:
    """The one denominator every recipe's common-reference MFU divides by on this device
    (engine.measure.peaks.COMMON_CONVENTION)."""
    if info.kind != "cuda":
        return _common_peak(None)
    return _common_peak(info.name, sm_count=info.sm_count, mig=info.mig)
