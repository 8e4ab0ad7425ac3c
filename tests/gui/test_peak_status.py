"""The status bar's measured matmul peak and its "Measure again" button: the benchmark
runs in a thread (the window keeps answering), the new figure is shown and replaces the
cached one that later runs divide MFU by."""

from __future__ import annotations

import json

import pytest

from engine.core.cache_dir import CACHE_DIR_ENV
from engine.measure import matmul_peak
from gui.main_window import MainWindow
from tests.gui.clicks import click, menu_action

OLD_RATE = 1e-6  # TFLOP/s no matmul runs at: the entry a remeasure must replace


@pytest.fixture
def cache_file(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    # a tiny time box per dtype: the test checks the path, not the figure's steadiness
    monkeypatch.setattr(matmul_peak, "BUDGET_S", {"cuda": 0.01, "cpu": 0.005})
    return tmp_path / "cache" / matmul_peak.CACHE_FILE


@pytest.fixture
def window(qtbot, cache_file):
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    qtbot.waitExposed(win)
    return win


def _seed(cache_file, info, tflops: dict | None = None) -> str:
    """An old measurement of the window's device, written as the cache stores it."""
    key = matmul_peak.cache_key(info.name, info.kind)
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    tflops = tflops or {"fp32": OLD_RATE}
    cache_file.write_text(json.dumps({key: {
        "key": key, "device": info.name, "torch_version": "old",
        "sizes": dict.fromkeys(tflops, 256), "measured_at_s": 0.0, "tflops": tflops,
        "reasons": {}, "failed": []}}))
    return key


def _shown_rates(label) -> dict[str, float]:
    """The figures the status bar shows, "matmul peak (TFLOP/s): fp32 0.41, bf16 0.031"
    -> {"fp32": 0.41, "bf16": 0.031}; the tooltip's first line names the same ones."""
    prefix = "matmul peak (TFLOP/s): "
    assert label.text().startswith(prefix), label.text()
    shown = {d: float(v) for d, v in (part.split() for part in
                                      label.text().removeprefix(prefix).split(","))}
    tip = label.toolTip().splitlines()[0].split(":", 1)[1].split("TFLOP/s")[0]
    assert shown == {d: float(v) for d, v in (part.split() for part in tip.split(","))}
    return shown


def _wait_done(qtbot, window) -> None:
    qtbot.waitUntil(lambda: not window.peak_status.is_busy()
                    and window.peak_status.button.isEnabled(), timeout=120_000)


def test_measure_again_reruns_off_the_gui_thread_and_replaces_the_cached_peak(
        qtbot, window, cache_file):
    status, info = window.peak_status, window.config_panel.device_info
    key = _seed(cache_file, info)
    window.config_panel.device_changed.emit(info)  # as a probe answer: the seeded entry shows
    assert _shown_rates(status.label) == {"fp32": OLD_RATE}
    assert status.button.text() == "Measure again"

    click(status.button)
    # the click returned at once: the benchmark is in its thread, Run waits for it
    assert status.is_busy() and status.label.text().startswith("measuring matmul peak")
    assert not status.button.isEnabled() and not window.run_button.isEnabled()
    _wait_done(qtbot, window)

    entry = json.loads(cache_file.read_text(encoding="utf-8"))[key]
    assert entry["measured_at_s"] > 0 and entry["torch_version"] != "old"
    assert entry["tflops"]["fp32"] > 0 and entry["tflops"]["fp32"] != OLD_RATE
    shown = _shown_rates(status.label)
    # every figure in the cache is shown, to the three digits the label gives
    assert shown == {d: float(f"{r:.3g}") for d, r in entry["tflops"].items()}
    assert "bf16" in shown  # CPU: bf16 emulated, still timed
    assert matmul_peak.cached(info).tflops == entry["tflops"]  # what later trials divide by
    assert window.run_button.isEnabled()


def test_the_run_menu_measures_a_device_never_measured(qtbot, window, cache_file):
    status = window.peak_status
    assert not cache_file.exists()
    assert status.label.text().startswith("matmul peak: not measured yet")
    assert status.button.text() == "Measure matmul peak"
    menu_action(window, "Run", "Measure matmul peak again").trigger()
    assert status.is_busy()
    _wait_done(qtbot, window)
    entry = next(iter(json.loads(cache_file.read_text(encoding="utf-8")).values()))
    assert _shown_rates(status.label)["fp32"] == float(f"{entry['tflops']['fp32']:.3g}")
    assert status.button.text() == "Measure again"


def test_every_figure_shows_whole_in_the_status_bar_at_1366_by_768(qtbot, window, cache_file):
    """The label once read "matmul peak 06:20", the figures only in its tooltip. With a
    peak per dtype (an H200's five, as its report names them) and the status bar's message
    on, every figure is on screen, unclipped."""
    window.resize(1366, 768)
    status, info = window.peak_status, window.config_panel.device_info
    rates = {"fp32": 51.2, "tf32": 378.0, "bf16": 701.0, "fp16": 702.0, "fp8": 1330.0}
    _seed(cache_file, info, rates)
    window.config_panel.device_changed.emit(info)
    window.statusBar().showMessage("Showing run 20261127-101500-abcd (ok)")
    qtbot.waitUntil(lambda: status.label.width() >= status.label.sizeHint().width())
    assert _shown_rates(status.label) == {d: float(f"{r:.3g}") for d, r in rates.items()}
    label = status.label
    assert label.isVisible() and label.visibleRegion().boundingRect().width() >= \
        label.fontMetrics().horizontalAdvance(label.text())
    right = label.mapTo(window, label.rect().topRight()).x()
    assert right <= window.width()  # inside the window, not past its edge
