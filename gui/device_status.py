"""The status-bar line that says what the chosen device is and can do."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter
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
    """This machine's device; while a run from another device is on show, that run's device,
    model, shape and versions instead (this machine's line moves to the tooltip). The line
    gives way to the status bar's message: it is drawn elided to the width it is given
    (``text()`` stays whole), so the window can narrow it while a message shows."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._device = PROBING
        self._device_tips = ""
        self._run: str | None = None

    def show_device(self, info: DeviceInfo | None, error: str | None = None) -> None:
        self._device = device_summary(info, error)
        tips = [f"{p}: {r}" for p, r in (info.unsupported.items() if info else ())]
        tips += [f"{p} (emulated): {v.reason}" for p, v in (info.verdicts.items() if info else ())
                 if v.support == "emulated" and p not in info.unsupported]
        if info is not None and not info.nvml_available:
            tips.append(f"NVML: {nvml.unavailable_reason()}")
        self._device_tips = "\n".join(tips)
        self._refresh()

    def show_run(self, summary: str | None) -> None:
        """Name the run on show (``run_origin.run_summary``), or None: this machine again."""
        self._run = summary
        self._refresh()

    def _refresh(self) -> None:
        if self._run is None:
            self.setText(self._device)
            self.setToolTip(self._device_tips)
        else:
            self.setText(f"ran on {self._run}")
            self.setToolTip(f"The run on show ran on {self._run}\nThis machine: {self._device}")

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        return QSize(0, super().minimumSizeHint().height())

    def is_elided(self) -> bool:
        return self.fontMetrics().horizontalAdvance(self.text()) > self.contentsRect().width()

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        painter = QPainter(self)
        rect = self.contentsRect()
        text = self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight,
                                             rect.width())
        painter.drawText(rect, int(Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft),
                         text)
