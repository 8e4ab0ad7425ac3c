"""File > Open shows each of the 11 JSON reports of the first GPU run (an H200); the five
holding NVML's NaN say in the log, once, which file and fields were read as n/a."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QFileDialog

from gui.main_window import MainWindow
from tests.engine.test_h200_reports import NAMES, REPORTS, nonfinite_fields, unpack
from tests.gui.clicks import RUN_TIMEOUT_MS, pause


@pytest.fixture
def window(qtbot):
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    qtbot.waitUntil(lambda: not win.config_panel.device_pending(), timeout=RUN_TIMEOUT_MS)
    return win


def _open_through_file_menu(window, monkeypatch, path) -> None:
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(path), "")))
    file_menu = window.menuBar().actions()[0].menu()
    open_action = next(a for a in file_menu.actions() if a.text().startswith("&Open"))
    open_action.trigger()


def test_every_real_h200_report_opens_in_the_window(qtbot, window, tmp_path, monkeypatch):
    assert len(NAMES) == 11 and REPORTS.is_dir()
    failures = []
    window.open_failed.connect(failures.append)
    for name in NAMES:
        path = unpack(name, tmp_path)
        bad = nonfinite_fields(path.read_text())
        with qtbot.waitSignal(window.record_shown, timeout=RUN_TIMEOUT_MS) as shown:
            _open_through_file_menu(window, monkeypatch, path)
        assert not failures, failures
        record = shown.args[0]
        assert window.record is record and record.trials
        assert window.statusBar().currentMessage().startswith(f"Showing run {record.run_id}")
        assert window.run_progress.text() == "report"  # no run is in progress
        log = window.log.toPlainText()
        if bad:
            assert log.count("was repaired on reading") == 1, log
            assert str(path) in log and "gpm_dram_bw_util_pct" in log
        else:
            assert "repaired" not in log


def test_a_gpm_rate_the_report_lacks_reads_na_in_the_kernels_tab(qtbot, window, tmp_path,
                                                                   monkeypatch):
    """The H200's fp32 trial at 2 x 128 has GPM rates but no DRAM bandwidth (NVML's NaN,
    repaired on reading): the Kernels tab's GPM cell names it n/a, never "None%"."""
    path = unpack("04-gpt2-fp32.json", tmp_path)
    with qtbot.waitSignal(window.record_shown, timeout=RUN_TIMEOUT_MS):
        _open_through_file_menu(window, monkeypatch, path)
    gpm = window.record.trials[0].gpm
    assert gpm.dram_bw_util_pct is None and gpm.sm_util_pct is not None
    view = window.kernel_view
    window.tabs.setCurrentWidget(view)
    column = next(c for c in range(view.summary.columnCount())
                  if view.summary.horizontalHeaderItem(c).text() == "Tensor pipes (GPM)")
    tip = view.summary.item(0, column).toolTip()
    assert "None" not in tip and "DRAM bandwidth n/a" in tip, tip
    assert f"SM active {gpm.sm_util_pct:.1f}%" in tip


def test_the_kernels_summary_shows_every_precision_at_1366_by_768(qtbot, window, tmp_path,
                                                                  monkeypatch):
    """The H200 sweep's six precisions: the Kernels tab's summary shows each row whole on a
    laptop screen, with no scroll bar of its own, and the op tables keep half the tab."""
    window.resize(1366, 768)
    path = unpack("01-gpt2-fp32_tf32_fp16-amp_bf16-amp_fp16_bf16.json", tmp_path)
    with qtbot.waitSignal(window.record_shown, timeout=RUN_TIMEOUT_MS):
        _open_through_file_menu(window, monkeypatch, path)
    view = window.kernel_view
    window.tabs.setCurrentWidget(view)
    pause(200)
    summary = view.summary
    assert summary.rowCount() == 6
    assert summary.verticalScrollBar().maximum() == 0
    shown = summary.viewport().rect()
    for row in range(6):
        cell = summary.visualItemRect(summary.item(row, 0))
        assert shown.contains(cell), (row, cell, shown)
    upper, lower = view.split.sizes()
    assert lower >= upper


def test_every_bar_caption_of_the_compare_tab_is_inside_its_chart_at_1366_by_768(
        qtbot, window, tmp_path, monkeypatch):
    """A caption is a line of text above its bar: on the Compare tab's short charts a fixed
    share of headroom cut the tallest bars' captions ("61.1%", "13.92 GiB") at the top."""
    import pyqtgraph as pg

    window.resize(1366, 768)
    path = unpack("01-gpt2-fp32_tf32_fp16-amp_bf16-amp_fp16_bf16.json", tmp_path)
    with qtbot.waitSignal(window.record_shown, timeout=RUN_TIMEOUT_MS):
        _open_through_file_menu(window, monkeypatch, path)
    window.tabs.setCurrentWidget(window.compare_view)
    pause(300)
    for key in ("throughput", "mfu", "peak_memory"):
        box = window.compare_view.plots[key].getViewBox()
        inside = box.sceneBoundingRect()
        captions = [item for item in box.addedItems if isinstance(item, pg.TextItem)]
        assert len(captions) == 6, key
        for caption in captions:
            rect = caption.sceneBoundingRect()
            assert rect.top() >= inside.top() - 1, (key, caption.textItem.toPlainText())
