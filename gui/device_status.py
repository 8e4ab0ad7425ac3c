"""The status-bar line that says what the chosen device is and can do."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtWidgets import QLabel, QWidget

from engine import nvml

if TYPE_CHECKING:  # engine.device imports torch: the probe runs in a thread instead
    from engine.device import DeviceInfo

PROBING = "probing device…"


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


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
        f"CUDA {info.cuda_version}" if info.cuda_version else "CUDA: none",
        "NVML: available" if info.nvml_available else "NVML: n/a",
        f"bf16: {info.bf16_text}",
        f"fp8: {_yes_no(info.fp8_supported)}",
    ]
    return "  |  ".join(parts)


class DeviceStatus(QLabel):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)

    def show_device(self, info: DeviceInfo | None, error: str | None = None) -> None:
        self.setText(device_summary(info, error))
        tips = [f"{p}: {r}" for p, r in (info.unsupported.items() if info else ())]
        if info is not None and not info.nvml_available:
            tips.append(f"NVML: {nvml.unavailable_reason()}")
        self.setToolTip("\n".join(tips))
