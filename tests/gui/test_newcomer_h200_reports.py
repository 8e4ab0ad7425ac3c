"""A newcomer opens the H200's reports (File > Open) and reads the Kernels and Compare tabs
at 1366 x 768: no Python exception names, each MFU bar says what it divides by when the
recipes' peaks differ, the reasons an MFU is n/a are written where no bar is, and no
"-0.0000" in the comparison table. Expected texts are read from the report files with json,
independently of the window's reader."""

from __future__ import annotations

import html
import json
import re

import pyqtgraph as pg
import pytest
from PySide6.QtCore import QRectF
from PySide6.QtWidgets import QFileDialog, QLabel

from gui.main_window import MainWindow
from tests.engine.test_h200_reports import unpack
from tests.gui.clicks import RUN_TIMEOUT_MS, choose, click_tab, menu_action, pause

EXCEPTION_NAME = re.compile(r"\b[A-Z]\w*(Error|Exception)\b")


@pytest.fixture
def window(qtbot):
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    win.resize(1366, 768)
    return win


def _open(qtbot, window, monkeypatch, path) -> None:
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(path), "")))
    with qtbot.waitSignal(window.record_shown, timeout=RUN_TIMEOUT_MS):
        menu_action(window, "File", "Open report or journal…").trigger()


def _visible_texts(widget) -> list[str]:
    return [label.text() for label in widget.findChildren(QLabel) if label.isVisible()]


@pytest.mark.parametrize("name", ["03-gpt2-int8_nf4.json",
                                  "01-gpt2-fp32_tf32_fp16-amp_bf16-amp_fp16_bf16.json"])
def test_the_kernels_tab_says_in_words_why_an_old_report_has_no_kernel_table(
        qtbot, window, monkeypatch, tmp_path, name):
    path = unpack(name, tmp_path)
    report = json.loads(path.read_text())
    torch = report["environment"]["libraries"]["torch"]
    _open(qtbot, window, monkeypatch, path)
    click_tab(window.tabs, "Kernels")
    view = window.kernel_view
    for trial in report["trials"]:
        raw = trial["profiled_step_reason"]
        assert "AttributeError" in raw  # what the old AmpScope wrote
        choose(view.precision, trial["precision"])
        shown = view.detail_note.text()
        assert shown.startswith(f"{trial['precision']}: n/a: the kernel table was not recorded")
        assert f"torch {torch}" in shown and "Re-run" in shown and "current AmpScope" in shown
        assert not EXCEPTION_NAME.search(shown) and "linked_correlation_id" not in shown
        assert raw in view.detail_note.toolTip()  # the raw text, behind the tooltip
    for row in range(view.summary.rowCount()):
        for col in range(1, view.summary.columnCount() - 1):
            item = view.summary.item(row, col)
            assert item.text() == "n/a"
            assert item.toolTip().startswith("the kernel table was not recorded")
    for text in _visible_texts(view):
        assert not EXCEPTION_NAME.search(text), text


def _captions(plot) -> list[pg.TextItem]:
    return [i for i in plot.getViewBox().addedItems if isinstance(i, pg.TextItem)]


def _bar_rects(plot) -> list[QRectF]:
    """Each bar's rectangle in scene coordinates."""
    rects = []
    for item in plot.getViewBox().addedItems:
        if isinstance(item, pg.BarGraphItem):
            opts = item.opts
            for x, h in zip(opts["x"], opts["height"], strict=True):
                w = opts["width"]
                rects.append(item.mapRectToScene(QRectF(x - w / 2, 0, w, h)).normalized())
    return rects


def test_mfu_bars_name_their_peak_where_the_recipes_divide_by_different_ones(
        qtbot, window, monkeypatch, tmp_path):
    """int8 read 2.9% and the faster nf4 0.9%: each divides by its own datasheet peak."""
    path = unpack("03-gpt2-int8_nf4.json", tmp_path)
    report = json.loads(path.read_text())
    _open(qtbot, window, monkeypatch, path)
    click_tab(window.tabs, "Compare")
    pause(300)
    plot = window.compare_view.plots["mfu"]
    shown = sorted(c.textItem.toPlainText() for c in _captions(plot))
    expected = []
    for trial in report["trials"]:
        s = trial["summary"]
        tflops = s["peak_flops"] / 1e12
        peak = f"{tflops:,.0f}" if tflops >= 100 else f"{tflops:.3g}"
        expected.append(f"{100 * s['mfu']:.1f}%\nof {peak} TFLOP/s")
    assert shown == sorted(expected)  # "2.9% of 207 TFLOP/s", "0.9% of 989 TFLOP/s"
    _assert_captions_clear(plot)


def _assert_captions_clear(plot) -> None:
    """Captions inside the plot, apart from each other and from every bar."""
    inside = plot.getViewBox().sceneBoundingRect()
    captions = [c.sceneBoundingRect() for c in _captions(plot)]
    for i, rect in enumerate(captions):
        assert inside.contains(rect.adjusted(1, 1, -1, -1)), (rect, inside)
        for other in captions[i + 1:]:
            assert not rect.intersects(other), (rect, other)
        for bar in _bar_rects(plot):
            assert not rect.adjusted(1, 1, -1, -1).intersects(bar), (rect, bar)


def test_mfu_na_reasons_are_written_off_the_bars(qtbot, window, monkeypatch, tmp_path):
    """The trace run: bf16-amp's bar (6.6%) and two interrupted fp8 trials. Their reason
    was drawn across the chart, over the bar; now it is a line under the charts."""
    path = unpack("trace-run.json", tmp_path)
    report = json.loads(path.read_text())
    _open(qtbot, window, monkeypatch, path)
    click_tab(window.tabs, "Compare")
    pause(300)
    view = window.compare_view
    plot = view.plots["mfu"]
    summaries = {t["precision"]: t["summary"] or {} for t in report["trials"]}
    reasons = {p: s["mfu_reason"] for p, s in summaries.items()
               if s.get("mfu") is None and s.get("mfu_reason")}
    assert reasons  # the interrupted fp8 trial says why
    for precision, why in reasons.items():
        assert precision in view.mfu_note.text() and why in view.mfu_note.text()
    assert view.mfu_note.isVisible()
    charts = view.charts.geometry()
    note = view.mfu_note.geometry()
    assert note.top() >= charts.bottom()  # under the charts, over no bar
    assert all("MFU n/a" not in c.textItem.toPlainText() for c in _captions(plot))
    _assert_captions_clear(plot)


def test_a_loss_difference_that_rounds_to_zero_reads_without_a_sign(qtbot, window,
                                                                    monkeypatch, tmp_path):
    """tf32's final loss 3e-6 under fp32's: "0.0000", not "-0.0000"."""
    path = unpack("01-gpt2-fp32_tf32_fp16-amp_bf16-amp_fp16_bf16.json", tmp_path)
    report = json.loads(path.read_text())
    trials = {t["precision"]: t for t in report["trials"]}
    lower = trials["fp32"]["summary"]["final_loss"] - 3e-6
    trials["tf32"]["summary"]["final_loss"] = lower
    trials["tf32"]["steps"][-1]["loss"] = lower
    path.write_text(json.dumps(report))
    _open(qtbot, window, monkeypatch, path)
    click_tab(window.tabs, "Compare")
    tsv = window.compare_view.table_tsv()
    rows = [line.split("\t") for line in tsv.splitlines()]
    column = rows[0].index("Final loss vs fp32")
    cells = {r[0]: r[column] for r in rows[1:]}
    assert cells["tf32"] == "0.0000"
    assert "-0.0000" not in tsv
    # the others keep their sign: bf16-amp's loss is below fp32's by about 0.0011
    diff = trials["bf16-amp"]["summary"]["final_loss"] - trials["fp32"]["summary"]["final_loss"]
    assert cells["bf16-amp"] == f"{diff:+.4f}" and cells["bf16-amp"].startswith("-")


def test_the_run_tab_verdict_of_a_sweep_leaves_the_charts_their_room(qtbot, window,
                                                                   monkeypatch, tmp_path):
    """The six-precision sweep's verdict ran to seven lines over the Run tab's charts: the
    banner says the answer and its figures in a line or two, the rest is on hover and in
    Compare (Details…)."""
    _open(qtbot, window, monkeypatch, unpack(
        "01-gpt2-fp32_tf32_fp16-amp_bf16-amp_fp16_bf16.json", tmp_path))
    click_tab(window.tabs, "Run")
    pause(100)
    banner = window.verdict_banner
    shown = banner.headline.text()
    whole = window.compare_view.verdict_label.text().splitlines()[0]
    assert shown.startswith("Train in bf16-amp: ") and "; " not in shown
    assert whole.startswith(shown + "; ") and html.escape(whole) in banner.toolTip()
    lines = banner.headline.height() / banner.headline.fontMetrics().lineSpacing()
    assert lines <= 2.5, lines
