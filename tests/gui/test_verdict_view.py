"""The verdict first in Compare, the device's bf16 truth in the status bar, and each
precision's description in the Run form."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QFileDialog

from engine.record.compare import format_bytes
from engine.report.json_io import write_json
from gui.main_window import MainWindow
from tests.engine.verdict_records import GiB, median_ms, record, trial
from tests.gui.clicks import hover


@pytest.fixture
def window(qtbot):
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    return win


def _open_with_the_file_menu(qtbot, window, monkeypatch, path) -> None:
    """Click File in the menu bar, then click "Open report or journal" in the menu."""
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(path), ""))
    bar = window.menuBar()
    file_action = bar.actions()[0]
    QTest.mouseClick(bar, Qt.MouseButton.LeftButton,
                     pos=bar.actionGeometry(file_action).center())
    menu = file_action.menu()
    qtbot.waitUntil(menu.isVisible)
    open_action = next(a for a in menu.actions() if a.text().startswith("&Open report"))
    with qtbot.waitSignal(window.record_shown, timeout=60_000):
        QTest.mouseClick(menu, Qt.MouseButton.LeftButton,
                         pos=menu.actionGeometry(open_action).center())


def _tab(window, name: str) -> None:
    bar = window.tabs.tabBar()
    index = next(i for i in range(bar.count()) if bar.tabText(i).replace("&", "") == name)
    QTest.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(index).center())


def test_compare_opens_with_the_verdict_above_everything(qtbot, window, monkeypatch, tmp_path):
    fp32 = trial("fp32", 100.0, 8 * GiB, 3.0)
    bf16 = trial("bf16-amp", 50.0, 5 * GiB, 3.001)
    fp16 = trial("fp16-amp", 50.0, 5 * GiB, 3.0, skipped=2, seed=4)
    rec = record(fp32, bf16, fp16)
    rec.config = {"model": "tiny", "precisions": ["fp32", "bf16-amp", "fp16-amp"]}
    rec.status = "ok"
    path = write_json(rec, tmp_path / "run.json")
    _open_with_the_file_menu(qtbot, window, monkeypatch, path)
    _tab(window, "Compare")
    label = window.compare_view.verdict_label
    assert label.isVisible()
    speedup = median_ms(fp32) / median_ms(bf16)
    text = label.text()
    assert text.startswith(f"Train in bf16-amp: {speedup:.2f}x fp32's speed [")
    assert f"saves {format_bytes(3 * GiB)} (38%)" in text
    assert text.endswith("fp16-amp is as fast but skipped 2 steps")
    # first: above the charts, the speed note and the table
    top = label.mapTo(window.compare_view, QPoint(0, 0)).y()
    for widget in (window.compare_view.charts, window.compare_view.speed_note,
                   window.compare_view.table):
        assert widget.mapTo(window.compare_view, QPoint(0, 0)).y() > top


def test_a_report_with_one_precision_answers_and_says_what_to_do(qtbot, window, monkeypatch,
                                                                 tmp_path):
    rec = record(trial("fp32", 100.0, 8 * GiB, 3.0))
    rec.config = {"model": "tiny", "precisions": ["fp32"]}
    path = write_json(rec, tmp_path / "one.json")
    _open_with_the_file_menu(qtbot, window, monkeypatch, path)
    _tab(window, "Compare")
    text = window.compare_view.verdict_label.text()
    assert text.startswith("Train in fp32: the only precision in this run, so nothing was "
                           "compared with it")
    assert "\nTo do: profile fp32 with bf16-amp" in text


def test_each_precision_in_the_picker_says_what_it_trains(qtbot, window):
    import json

    from engine.core.resources import RESOURCES
    from gui.config_panel import uncompiled

    texts = json.loads((RESOURCES / "precisions.json").read_text())
    panel = window.config_panel
    listed = panel.precisions
    for row in range(listed.count()):
        item = listed.item(row)
        name = item.data(Qt.ItemDataRole.UserRole)
        listed.scrollToItem(item)
        centre = listed.visualItemRect(item).center()
        # as a pointer comes, from beside the item: scrolled rows share a pixel, and a move
        # onto the pixel the pointer is already on is no move at all
        hover(listed.viewport(), centre + QPoint(0, 40 if centre.y() < 40 else -40))
        hover(listed.viewport(), centre)
        qtbot.waitUntil(lambda n=name: panel.precision_help.text().startswith(f"{n}: "))
        # a per-layer variant ("fp8:keep-ends") has its suffix's line, "FP8:keep-ends: ..."
        keep = name.partition(":")[2]
        text = texts[f":{keep}"].partition(": ")[2] if keep else texts[name]
        line = f"{name}: {text}"
        if item.font().italic():  # emulated here: uncompiled, and its line says so
            line = uncompiled(line)
        assert panel.precision_help.text().split("\n")[0] == line
        assert item.toolTip().split("\n")[0] == line
    # the int8 and nf4 lines say they train LoRA adapters, not the whole model
    assert "LoRA adapters" in texts["int8"] and "LoRA adapters" in texts["nf4"]
    # greyed out with the reason, as before, under the description (tf32 on a CPU)
    tf32 = listed.findItems("tf32", Qt.MatchFlag.MatchExactly)[0]
    if panel.device_info.kind == "cpu":
        assert not tf32.flags() & Qt.ItemFlag.ItemIsEnabled
        assert "\ntf32 cannot run here: TF32 is a Tensor Core matmul mode" in tf32.toolTip()


def test_status_bar_says_when_bf16_is_emulated(window):
    with open("/proc/cpuinfo", encoding="utf-8") as fh:
        flags = {f for line in fh if line.startswith("flags") for f in line.split(":")[1].split()}
    text = window.device_status.text()
    if window.config_panel.device_info.kind != "cpu" or not flags:
        pytest.skip("a GPU, or a CPU without x86 flags: the CPU rule does not apply")
    if {"avx512_bf16", "amx_bf16"} & flags:
        assert "bf16: yes" in text
    else:
        assert "bf16: emulated (no AVX512-BF16/AMX), slow" in text


def test_verdict_and_every_table_row_fit_a_laptop_screen(qtbot, window, monkeypatch,
                                                         tmp_path):
    rec = record(trial("fp32", 100.0, 8 * GiB, 3.0), trial("bf16-amp", 50.0, 5 * GiB, 3.0),
                 trial("fp16-amp", 50.0, 5 * GiB, 3.0, skipped=2, seed=4))
    rec.config = {"model": "tiny", "precisions": ["fp32", "bf16-amp", "fp16-amp"]}
    window.resize(1366, 698)  # 768 less a title bar and a panel
    path = write_json(rec, tmp_path / "run.json")
    _open_with_the_file_menu(qtbot, window, monkeypatch, path)
    _tab(window, "Compare")
    qtbot.wait(50)
    view = window.compare_view
    label = view.verdict_label
    assert label.visibleRegion().boundingRect().size() == label.size()
    table = view.table
    last = table.visualRect(table.model().index(table.model().rowCount() - 1, 0))
    assert table.viewport().rect().contains(last)  # every row shows without scrolling
