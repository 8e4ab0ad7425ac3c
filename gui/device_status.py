"""The status-bar line that says what the chosen device is and can do."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtWidgets import QLabel, QWidget

from engine.measure import nvml

if TYPE_CHECKING:  # engine.measure.device imports torch: the probe runs in a thread instead
    from engine.measure.device import DeviceInfo

PROBING = "probing device…"


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def _fp8(info: DeviceInfo) -> str:
    verdict = info.verdict("fp8")
    if verdict is not None and verdict.support == "emulated":
        return "emulated"  # it runs, but not on fp8 hardware (engine/measure/gating.py)
    return _yes_no(info.fp8_supported)


def device_summary(info: DeviceInfo | None, error: str | None = None) -> str:
    """One line on the device; "probing device…" while the probe has not answered."""
    if info is None and error is None:
        return PROBING
    if info is None:
        return f"Device unavailable: {error or 'not probed'}"
    cc = ".".join(map(str, info.compute_capability)) if info.compute_capability else "n/a"
    parts = [
        info.name if info.kind == "cuda" else f"CPU: {info.name}",
        f"compute capability {cc}",
        *([f"{info.gcn_arch}, ROCm/HIP {info.hip_version}"] if info.gcn_arch else
          [f"CUDA {info.cuda_version}" if info.cuda_version else "CUDA: none"]),
        f"{'AMD SMI' if info.gcn_arch else 'NVML'}: "
        f"{'available' if info.nvml_available else 'n/a'}",
        f"bf16: {info.bf16_text}",
        f"fp8: {_fp8(info)}",
    ]
    return "  |  ".join(parts)


class DeviceStatus(QLabel):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)

    def show_device(self, info: DeviceInfo | None, error: str | None = None) -> None:
        self.setText(device_summary(info, error))
        tips = [f"{p}: {r}" for p, r in (info.unsupported.items() if info else ())]
        tips += [f"{p} (emulated): {v.reason}" for p, v in (info.verdicts.items() if info else ())
                 if v.support == "emulated" and p not in info.unsupported]
        if info is not None and not info.nvml_available:
            tips.append(f"NVML: {nvml.unavailable_reason()}")
        self.setToolTip("\n".join(tips))
