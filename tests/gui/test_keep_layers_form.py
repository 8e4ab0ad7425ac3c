"""The Run form offers the per-layer variants fp8:keep-ends and fp8:keep-attn under fp8,
each with its one-line description, marked or greyed by fp8's gating verdict, and the Run
button trains the ticked one with its kept layers in bf16."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from engine.measure import gating
from gui.main_window import MainWindow
from tests.gui.clicks import RUN_TIMEOUT_MS, choose, click, list_item, tick, type_into

ROOT = Path(__file__).resolve().parents[2]
TEXTS = json.loads((ROOT / "resources" / "precisions.json").read_text(encoding="utf-8"))
VARIANTS = {"fp8:keep-ends": "the first and last transformer blocks stay in bf16, the rest fp8",
            "fp8:keep-attn": "attention projections stay in bf16, the MLPs run in fp8"}


@pytest.fixture
def window(qtbot):
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    qtbot.waitUntil(lambda: not win.config_panel.device_pending(), timeout=RUN_TIMEOUT_MS)
    return win


def _rows(panel) -> list[str]:
    return [panel.precisions.item(i).data(Qt.ItemDataRole.UserRole)
            for i in range(panel.precisions.count())]


def test_keep_variants_are_listed_under_fp8_described_and_marked_like_it(window):
    panel = window.config_panel
    rows = _rows(panel)
    at = rows.index("fp8")
    assert rows[at + 1:at + 3] == list(VARIANTS)
    emulated = gating.verdict("fp8", gating.CPU)
    assert emulated.support == "emulated"
    for name, line in VARIANTS.items():
        assert TEXTS[":" + name.split(":")[1]].endswith(line)  # the resource's own words
        item = list_item(panel.precisions, name)
        # as fp8 is marked on the CPU: emulated, italic, tickable, the reason in the tip
        assert item.text() == f"{name} (emulated)" and item.font().italic()
        assert item.flags() & Qt.ItemFlag.ItemIsUserCheckable
        assert item.toolTip().splitlines() == [f"{name}: {line}",
                                               f"{name} runs emulated here: {emulated.reason}"]
        panel.precisions.setCurrentItem(item)  # pointing at it says what it trains
        assert panel.precision_help.text().startswith(f"{name}: {line}")


MISSING = "torchao is not installed (pip install torchao)"


def test_keep_variants_are_greyed_where_fp8_cannot_run(qtbot, monkeypatch):
    import engine.measure.device

    real = engine.measure.device.probe

    def probe(device):  # the probe's answer on a machine without torchao's float8
        info = real(device)
        return dataclasses.replace(info, unsupported={**info.unsupported, "fp8": MISSING})

    monkeypatch.setattr(engine.measure.device, "probe", probe)
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    qtbot.waitUntil(lambda: not win.config_panel.device_pending(), timeout=RUN_TIMEOUT_MS)
    panel = win.config_panel
    for name in ("fp8", *VARIANTS):
        item = list_item(panel.precisions, name)
        assert not item.flags() & Qt.ItemFlag.ItemIsEnabled, name
        assert item.checkState() == Qt.CheckState.Unchecked
        assert item.toolTip().splitlines()[-1] == f"{name} cannot run here: {MISSING}"
    assert list_item(panel.precisions, "fp8-rowwise").flags() & Qt.ItemFlag.ItemIsEnabled


def test_a_ticked_keep_variant_runs_through_the_run_button_with_its_layers_kept(qtbot, window):
    panel = window.config_panel
    choose(panel.preset, "tiny")
    for name in _rows(panel):
        if list_item(panel.precisions, name).flags() & Qt.ItemFlag.ItemIsEnabled:
            tick(panel.precisions, name, name == "fp8:keep-attn")
    for box, value in ((panel.batch_size, 1), (panel.seq_len, 16), (panel.steps, 1),
                       (panel.warmup, 0)):
        type_into(box, str(value))
    choose(panel.device, "cpu")
    choose(panel.isolation, "inline")
    qtbot.waitUntil(lambda: not panel.device_pending(), timeout=RUN_TIMEOUT_MS)
    with qtbot.waitSignal(window.record_shown, timeout=RUN_TIMEOUT_MS) as shown:
        click(window.run_button)
    record = shown.args[0]
    assert record.config["precisions"] == ["fp8:keep-attn"]
    (trial,) = record.trials
    assert trial.precision == "fp8:keep-attn" and trial.status == "ok", trial.reason
    linears = {m.name: m.matmul_dtype for m in trial.module_tree
               if m.type in ("Linear", "Float8Linear") and m.name.startswith("transformer.h.")}
    # the tiny preset is GPT-2: attention in bf16, the MLPs in fp8
    assert linears and all(d == ("bf16" if ".attn." in n else "fp8") for n, d in linears.items())
