"""Memory across the step in the Compare tab (a real CLI report opened in the window) and in
the Plan tab (a plan traced from the form), hovered with the mouse."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pyqtgraph as pg
import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtTest import QTest

from engine.core.events import MemoryBreakdown, from_dict
from gui.main_window import MainWindow
from tests.gui.clicks import click, hover, pause, type_into

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_MS = 300_000
MIB = 2**20


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("timeline")
    out = tmp / "r.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AMPSCOPE_DATA_DIR": str(tmp / "data")}
    run = subprocess.run(
        [sys.executable, "main.py", "profile", "--model", "tiny", "--precision",
         "fp32,bf16-amp", "--batch-size", "2", "--seq-len", "32", "--steps", "1",
         "--warmup", "0", "--device", "cpu", "--isolation", "inline", "--quiet",
         "--no-kernel-profile", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    return out


def _tab(tabs, title: str):
    bar = tabs.tabBar()
    index = next(i for i in range(bar.count()) if bar.tabText(i) == title)
    QTest.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(index).center())
    pause(100)  # the tab's layout settles before a test maps points onto it
    return tabs.currentWidget()


def _open(qtbot, path) -> MainWindow:
    window = MainWindow()
    qtbot.addWidget(window)
    window.resize(1366, 768)
    window.show()
    qtbot.waitExposed(window)
    with qtbot.waitSignal(window.record_shown, timeout=TIMEOUT_MS):
        assert window.open_report(path)
    _tab(window.tabs, "Compare")
    return window


def _data_x(view, plot: int, pixel: QPoint) -> float:
    """The op a pointer at ``pixel`` of the chart stands on (a pixel spans several ops)."""
    return view.plots[plot].vb.mapSceneToView(view.charts.mapToScene(pixel)).x()


def _scroll_into_view(widget, point) -> None:
    """Scroll every scroll area around ``widget`` (a tab's page, the plots' own) until its
    pixel ``point`` is on the screen: the whole widget can be taller than the view."""
    from PySide6.QtWidgets import QScrollArea

    area = widget.parentWidget()
    while area is not None:
        if isinstance(area, QScrollArea):
            inside = widget.mapTo(area.widget(), point)
            area.ensureVisible(inside.x(), inside.y(), 40, 40)
        area = area.parentWidget()
    pause(50)


def _hover(qtbot, view, plot: int, x: float, category: str, label: str, trial) -> str:
    """Move the pointer to op ``x``, onto the middle of ``category``'s band there; returns
    what the chart says and what the trial's own points say it should."""
    column = view.scene_point(plot, x, 1.0).x()
    expected, y = _expected(trial, _data_x(view, plot, QPoint(column, 0)), category, label)
    pixel = QPoint(column, view.scene_point(plot, x, y).y())
    # a pointer reaches only what the window shows
    _scroll_into_view(view.charts.viewport(), pixel)
    seen = []
    view.charts.scene().sigMouseMoved.connect(seen.append)
    # as a pointer comes: from a pixel beside the target, then onto it
    hover(view.charts.viewport(), pixel + QPoint(3, 0))
    pause(60)  # past pyqtgraph's move rate limit, in an event loop
    hover(view.charts.viewport(), pixel)
    qtbot.waitUntil(lambda: bool(seen) and seen[-1] == view.charts.mapToScene(pixel))
    view.charts.scene().sigMouseMoved.disconnect(seen.append)
    text = view.hover_label.text()
    assert view.charts.toolTip() and text.split("; ")[0] in view.charts.toolTip()
    return text, expected


def _size(value: int) -> str:
    """Binary units, two decimals, the largest unit the value reaches."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value} B"


def _widest(timeline, keep=lambda point: True) -> float:
    """The middle of the longest-held moment among the points ``keep`` picks."""
    points = timeline.points
    held = [(b.op_index - a.op_index, (a.op_index + b.op_index) / 2)
            for a, b in zip(points, points[1:]) if keep(a)]
    return max(held)[1]


def _expected(trial, x: float, category: str, label: str) -> tuple[str, float]:
    """The hover text for the moment at op ``x``, worked out from the trial's own points,
    and the middle of that category's band (MiB)."""
    timeline = trial.memory_timeline
    point = [p for p in timeline.points if p.op_index <= x][-1]
    sizes = dict(zip(timeline.categories, point.category_bytes))
    below = sum(sizes[c] for c in timeline.categories[:timeline.categories.index(category)])
    total = sum(point.category_bytes)
    text = (f"{trial.precision}: {label} {_size(sizes[category])} of {_size(total)}; "
            f"op {point.op_index:,} of {timeline.ops:,}, {point.phase}; module: "
            f"{point.module or 'none (outside any forward)'}")
    return text, (below + sizes[category] / 2) / MIB


def test_compare_tab_hovers_each_precisions_step_by_category_and_module(qtbot, report):
    window = _open(qtbot, report)
    view = _tab(window.compare_view.tables, "Memory across the step")
    assert view is window.compare_view.timeline
    trials = window.record.trials
    assert [s.title for s in view.series] == [t.precision for t in trials]
    # one byte axis: every plot shows the same range, up to the highest peak
    ranges = {tuple(round(v, 6) for v in p.vb.viewRange()[1]) for p in view.plots}
    assert len(ranges) == 1
    top = max(t.memory.total_bytes for t in trials) / MIB
    assert next(iter(ranges))[1] >= top
    for i, trial in enumerate(trials):
        timeline = trial.memory_timeline
        # the parameters, then the activations a module's forward made (a pixel spans
        # several ops: each is aimed at the middle of a moment held for many ops)
        said, expected = _hover(qtbot, view, i, _widest(timeline), "params", "parameters",
                                trial)
        assert said == expected
        activations = timeline.categories.index("activations")
        said, expected = _hover(qtbot, view, i, _widest(
            timeline, lambda p, a=activations: p.phase == "forward" and p.module
            and p.category_bytes[a] > 0), "activations", "activations", trial)
        assert said == expected and "forward; module: " in said
        assert "module: none" not in said  # a forward's activations name their module
    assert "the trial ran on the CPU" in view.note.text()


def test_a_gpu_record_draws_reserved_and_nvml_levels(qtbot, report, tmp_path):
    """The H200's recorded memory fields (its run predates the timeline) under a CPU trial's
    real timeline: the allocator's reserved peak and NVML's process memory are drawn."""
    h200 = json.loads((ROOT / "tests/data/h200/bf16_amp_memory.json").read_text())
    data = json.loads(report.read_text())
    data["environment"]["device"] = h200["environment"]["device"]
    data["trials"] = [dict(data["trials"][0], memory=h200["memory"])]
    data.pop("comparison", None)
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(data))
    window = _open(qtbot, path)
    view = _tab(window.compare_view.tables, "Memory across the step")
    lines = [item for item in view.plots[0].items
             if isinstance(item, pg.InfiniteLine) and item.angle == 0]
    memory = from_dict(MemoryBreakdown, h200["memory"])
    labels = {line.label.format for line in lines}
    reserved = memory.peak_reserved_bytes / 2**30
    assert f"allocator reserved (peak, measured steps) {reserved:.2f} GiB" in labels
    assert f"NVML process memory {memory.nvml_process_bytes / 2**30:.2f} GiB" in labels
    usable = h200["environment"]["device"]["total_memory_bytes"] - memory.context_gap_bytes
    assert f"card usable (CUDA's figure - measured context) {usable / 2**30:.2f} GiB" in labels
    assert {round(line.value() * MIB) for line in lines} == {
        memory.peak_allocated_bytes, memory.peak_reserved_bytes, memory.nvml_process_bytes,
        usable}


def test_plan_tab_draws_the_traced_step_with_the_cards_usable_memory(qtbot):
    window = MainWindow()
    qtbot.addWidget(window)
    window.resize(1366, 768)
    window.show()
    qtbot.waitExposed(window)
    view = _tab(window.tabs, "Plan")
    type_into(view.model, "tiny")
    type_into(view.precisions, "bf16-amp")
    type_into(view.batch, "2")
    type_into(view.seq, "32")
    view.checkpointing.setChecked(True)
    type_into(view.cards, "RTX 4090")
    type_into(view.max_batch, "0")
    with qtbot.waitSignal(view.worker.finished, timeout=TIMEOUT_MS):
        click(view.plan_button)
    pause(100)  # the chart's layout settles before points are mapped onto it
    chart = view.timeline
    assert chart.charts.height() > 150
    (trial,) = view.last_result.trials
    assert [s.title for s in chart.series] == ["bf16-amp (traced)"]
    spans = [phase for _, _, phase in chart.series[0].spans]
    assert "recompute transformer.h.1" in spans and "recompute transformer.h.0" in spans
    (usable,) = [i for i in chart.plots[0].items if isinstance(i, pg.InfiniteLine)
                 and i.angle == 0]
    assert round(usable.value() * MIB) == trial.cards[0].usable_bytes
    # tiny's step is a sliver under a 24 GiB card's line: planned again for a card whose
    # memory is n/a (sold in two sizes, none named), its stack fills the axis and a
    # recompute can be hovered
    type_into(view.cards, "NVIDIA A100 PCIe")
    with qtbot.waitSignal(view.worker.finished, timeout=TIMEOUT_MS):
        click(view.plan_button)
    pause(100)
    (trial,) = view.last_result.trials
    assert trial.cards[0].usable_bytes is None
    assert not [i for i in chart.plots[0].items if isinstance(i, pg.InfiniteLine)
                and i.angle == 0]
    # hovering a recompute names it, and the module whose forward reran
    said, expected = _hover(qtbot, chart, 0, _widest(
        trial.memory_timeline, lambda p: p.phase.startswith("recompute")), "params",
        "parameters", dataclasses.replace(trial, precision="bf16-amp (traced)"))
    assert said == expected and ", recompute transformer.h." in said
