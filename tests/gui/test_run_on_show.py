"""A report from a GPU server, opened with File > Open on a laptop-sized window: the window
names the run's device, model, shape and versions, the Run form says it is not that run's,
every chart is readable (they scroll where they do not fit), messages that matter are
shown whole (widget text and geometry at
1366 x 768, the screen the README names)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtWidgets import QFileDialog

from tests.engine.test_h200_reports import unpack
from tests.gui.chart_room import assert_charts_readable
from tests.gui.clicks import click_tab, menu_action, shown_window

# the H200's six-precision gpt2 run: every GPU chart, several trials, NVML's NaN GPM polls
SIX = "01-gpt2-fp32_tf32_fp16-amp_bf16-amp_fp16_bf16.json"


@pytest.fixture
def h200(tmp_path) -> Path:
    return unpack(SIX, tmp_path)


@pytest.fixture
def window(qtbot):
    win = shown_window(qtbot)
    qtbot.waitUntil(lambda: "numerics_view" in win._built, timeout=60_000)
    return win


def _open(qtbot, monkeypatch, window, path: Path, signal: str = "record_shown"):
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(path), "")))
    with qtbot.waitSignal(getattr(window, signal), timeout=120_000) as blocker:
        menu_action(window, "File", "Open report or journal…").trigger()
    qtbot.wait(50)  # layouts settle
    return blocker.args[0]


def _message_fits(window) -> None:
    """The status bar's message is drawn left of the device line: it must fit there."""
    bar = window.statusBar()
    message = bar.currentMessage()
    room = window.device_status.geometry().left()
    assert bar.fontMetrics().horizontalAdvance(message) + 8 <= room, (message, room)


def _fits(label) -> None:
    """A wrapped label shows all its lines: as tall as its text needs at its width."""
    assert label.isVisible() and label.wordWrap()
    assert label.height() >= label.heightForWidth(label.width()), label.text()
    assert label.geometry().right() <= label.parentWidget().width()


def test_a_server_report_names_its_device_and_the_form_says_it_is_not_that_run(
        qtbot, monkeypatch, window, h200):
    here = window.config_panel.device_info
    record = _open(qtbot, monkeypatch, window, h200)
    facts = ("NVIDIA H200", "CUDA 13.0", "gpt2", "batch 8 × 1024 tokens", "torch 2.11.0",
             "transformers 5.17.0")
    click_tab(window.tabs, "Compare")
    qtbot.wait(50)
    top = window.compare_view.run_label
    assert top.text().startswith(f"Run {record.run_id} on NVIDIA H200")
    assert all(fact in top.text() for fact in facts), top.text()
    assert "fp32, tf32, fp16-amp, bf16-amp, fp16, bf16" in top.text()
    _fits(top)
    # above the verdict: the first thing on the tab
    assert top.geometry().bottom() < window.compare_view.verdict_label.geometry().top()
    assert all(fact in window.device_status.text() for fact in facts)
    assert here.name in window.device_status.toolTip()  # this machine's device, one hover away
    _message_fits(window)

    click_tab(window.tabs, "Run")
    qtbot.wait(50)
    banner = window.origin_banner
    assert "Showing a report from NVIDIA H200" in banner.text()
    assert "The form below is for a new run on this machine" in banner.text()
    assert here.name in banner.text()
    _fits(banner)
    # above the form, in view
    assert banner.mapTo(window, banner.rect().topLeft()).y() < window.config_panel.mapTo(
        window, window.config_panel.rect().topLeft()).y()


@pytest.mark.parametrize("size", [(1366, 768), (1600, 1000)])
def test_every_chart_of_a_gpu_report_is_readable_and_reachable(qtbot, monkeypatch, window, size,
                                                               h200):
    """Ten charts do not fit a laptop's window at a readable height: they keep it and scroll
    (they once all fitted, 32 px of plot each), the verdict and the Run button staying put."""
    window.resize(*size)
    _open(qtbot, monkeypatch, window, h200)
    click_tab(window.tabs, "Run")
    qtbot.wait(100)
    charts = window.charts
    shown = assert_charts_readable(window)
    if size == (1366, 768):  # ten charts at a readable height are taller than the tab
        assert charts.scroll.verticalScrollBar().maximum() > 0
    # a profile run on a GPU: the GPU charts, and none of a user's own loop
    assert {"monitor_gpm", "memory", "monitor_power"} <= set(shown)
    assert not {"learning_rate", "scalars"} & set(shown)
    view = charts.layout_widget
    width = view.viewport().width()
    assert view.mapToScene(view.viewport().rect()).boundingRect().left() == pytest.approx(0, abs=1)
    for key in shown:
        plot = charts.plots[key]
        box = plot.sceneBoundingRect()
        title = plot.titleLabel
        text = title.item.boundingRect()
        # the whole title (a monitor chart's names its curves) is inside its row
        assert text.width() <= box.width() + 1 and text.height() <= title.size().height() + 1, (
            key, text, title.size())
    legend = charts.legend.sceneBoundingRect()
    assert legend.right() <= width + 1
    # six trials' names would overprint on the monitor charts: their lines' colours say it
    lines = [line for _plot, line in charts._trial_lines]
    assert len(lines) >= 6 and all(getattr(line, "label", None) is None for line in lines)


def test_the_memory_legend_on_compare_stays_off_its_bars(qtbot, monkeypatch, window, h200):
    _open(qtbot, monkeypatch, window, h200)
    click_tab(window.tabs, "Compare")
    qtbot.wait(100)
    view = window.compare_view
    bars = view.plots["memory"].getViewBox().sceneBoundingRect()
    legend = view.memory_legend.sceneBoundingRect()
    assert legend.height() > 0 and not legend.intersects(bars), (legend, bars)
    assert legend.right() <= view.charts.viewport().width() + 1


def test_before_any_run_a_cpu_machine_shows_no_gpu_charts(window):
    if window.config_panel.device_info.kind != "cpu":
        pytest.skip("this machine has a GPU")
    shown = window.charts.visible_charts()
    assert "monitor_gpm" not in shown and "memory" not in shown
    titles = [window.charts.titles[k] for k in shown]
    assert not any(t.startswith("GPU") for t in titles), titles


def test_a_refused_report_says_why_whole(qtbot, monkeypatch, window, tmp_path):
    data = json.loads(unpack("06-gpt2-fp32.json", tmp_path).read_text(encoding="utf-8"))
    data["trials"][0]["steps"][0]["step_ms"] = 1e308  # no step takes that long
    broken = tmp_path / "a-report-from-the-server-with-a-long-name.json"
    broken.write_text(json.dumps(data), encoding="utf-8")
    message = _open(qtbot, monkeypatch, window, broken, "open_failed")
    notice = window.notice
    assert notice.isVisible() and notice.text() == f"Could not open the report: {message}"
    assert str(broken) in notice.text() and "step_ms" in notice.text()
    _fits(notice.label)
    assert notice.geometry().top() < window.tabs.geometry().top()  # above the tabs
    # longer than any status bar: the device line gave it all the room there is
    assert window.device_status.width() == 0

