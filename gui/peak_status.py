"""The status-bar figure of the device's measured matmul peak, with the button that
measures it again (the cache is per machine; clocks, drivers and torch change)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QWidget

from gui.worker import PeakBenchmark

if TYPE_CHECKING:  # both import torch: they are reached only once the device probe answered
    from engine.measure.device import DeviceInfo
    from engine.measure.matmul_peak import MeasuredPeak

MEASURE = "Measure matmul peak"
MEASURE_AGAIN = "Measure again"


def peak_summary(measured: MeasuredPeak | None) -> str:
    """"matmul peak: fp32 0.41, bf16 0.031 TFLOP/s (measured 10:20)", or why there is none."""
    if measured is None:
        return "matmul peak: not measured yet (the next run measures it)"
    rates = ", ".join(f"{d} {r:.3g}" for d, r in measured.tflops.items())
    when = time.strftime("%H:%M", time.localtime(measured.measured_at_s))
    return f"matmul peak: {rates or 'none timed'} TFLOP/s (measured {when})"


class PeakStatus(QWidget):
    busy_changed = Signal(bool)  # the benchmark started (True) or ended (False)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.label = QLabel()
        self.button = QPushButton(MEASURE)
        self.button.setToolTip("Time square matmuls per dtype on this device again (a few "
                               "seconds) and keep the result for the MFU of later runs")
        self.button.clicked.connect(self.measure)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.label)
        layout.addWidget(self.button)
        self.benchmark = PeakBenchmark(self)
        self.benchmark.progress.connect(self._on_progress)
        self.benchmark.measured.connect(self._on_measured)
        self.benchmark.failed.connect(self._on_failed)
        self._info: DeviceInfo | None = None
        self._blocked = False  # a run is on: its timings and the benchmark would skew each other
        self.show_device(None)

    def is_busy(self) -> bool:
        return self.benchmark.is_running()

    def show_device(self, info: DeviceInfo | None) -> None:
        """Show ``info``'s cached peak (None: no usable device yet)."""
        self._info = info
        if self.is_busy():
            return  # its answer, for the device it measures, comes soon
        if info is None:
            self.label.setText("matmul peak: n/a (no device)")
            self.label.setToolTip("")
        else:
            from engine.measure import matmul_peak

            self._show(matmul_peak.cached(info))
        self._update_button()

    def set_blocked(self, blocked: bool) -> None:
        """Disable measuring while a run or the numerics lab uses the device."""
        self._blocked = blocked
        self._update_button()

    def measure(self) -> bool:
        """Measure the chosen device's matmul peak again, off the GUI thread."""
        if self._info is None or self._blocked or self.is_busy():
            return False
        self.benchmark.start(self._info)
        self.label.setText("measuring matmul peak…")
        self._update_button()
        self.busy_changed.emit(True)
        return True

    def _show(self, measured: MeasuredPeak | None) -> None:
        summary = peak_summary(measured)
        if measured is None:  # short: the status bar's message has the room
            self.label.setText(summary.partition(" (")[0])
            self.label.setToolTip(summary)
        else:
            from engine.measure import matmul_peak

            # the figures themselves (a time alone told nothing); when they were taken and
            # how, per dtype, are in the tooltip
            rates = ", ".join(f"{d} {r:.3g}" for d, r in measured.tflops.items())
            self.label.setText(f"matmul peak (TFLOP/s): {rates or 'none timed'}")
            self.label.setToolTip("\n".join([summary, *(
                measured.lookup(d).source or measured.lookup(d).reason
                for d in matmul_peak.DTYPES)]))
        self.button.setText(MEASURE if measured is None else MEASURE_AGAIN)

    def _update_button(self) -> None:
        self.button.setEnabled(self._info is not None and not self._blocked
                               and not self.is_busy())

    def _on_progress(self, dtype: str, number: int, count: int) -> None:
        self.label.setText(f"measuring matmul peak… {dtype} ({number}/{count})")

    def _on_measured(self, info: DeviceInfo, measured: MeasuredPeak) -> None:
        self.benchmark.join()
        self._done()
        if self._info is not None and self._info.name == info.name:
            self._show(measured)
        else:  # the device was changed meanwhile: show the one now chosen
            self.show_device(self._info)

    def _on_failed(self, message: str) -> None:
        self.benchmark.join()
        self._done()
        self.label.setText(f"matmul peak: measuring failed: {message.splitlines()[0]}")
        self.label.setToolTip(message)

    def _done(self) -> None:
        self._update_button()
        self.busy_changed.emit(False)
