"""The MFU bar captions of the Compare tab: each bar's percentage, and, where the recipes
divide by different peaks, the peak under it.

Without a common reference (engine.measure.peaks.COMMON_CONVENTION: a GPU's 16-bit Tensor
Core peak) each recipe's MFU divides by its own dtype's peak: on a CPU fp16-amp read 1.5%
while the slowest, against a measured fp16 peak of 0.031 TFLOP/s; on the H200 nf4 read 0.9%
against int8's 2.9% while faster. Naming each bar's peak says why.
"""

from __future__ import annotations

from engine.core.events import TrialResult

# the summary field holding the peak each MFU field divides by
PEAK_FIELDS = {"mfu": "peak_flops", "mfu_measured": "measured_peak_flops",
               "mfu_common": "common_peak_flops"}


def tflops_text(flops_per_s: float) -> str:
    """"0.0307", "51.2", "989": three significant figures, no exponent."""
    tflops = flops_per_s / 1e12
    return f"{tflops:,.0f}" if tflops >= 100 else f"{tflops:.3g}"


def mfu_captions(trials: list[TrialResult], mfu: list[float | None],
                 field: str) -> list[str | None]:
    """"6.6%" per bar where every recipe divides by one peak; else "1.5%\\nof 0.0307 TFLOP/s"
    (the peak that bar divides by)."""
    peaks = [getattr(t.summary, PEAK_FIELDS[field], None) if t.summary else None
             for t in trials]
    shown = {p for p, v in zip(peaks, mfu, strict=True) if v is not None}
    one_peak = field == "mfu_common" or len(shown) <= 1
    captions: list[str | None] = []
    for value, peak in zip(mfu, peaks, strict=True):
        if value is None:
            captions.append(None)
        elif one_peak or not peak:
            captions.append(f"{value:.1f}%")
        else:
            captions.append(f"{value:.1f}%\nof {tflops_text(peak)} TFLOP/s")
    return captions
