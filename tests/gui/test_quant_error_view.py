"""The Compare tab's quantisation error after a real run from the Run button: one row per
trial with the median / worst-layer SQNR recomputed here from the trial's layers, the loss
vs fp32 from the two final losses, and the layers under each trial."""

from __future__ import annotations

import statistics

from engine.core.config import RunConfig
from gui.main_window import MainWindow
from tests.gui.clicks import RUN_TIMEOUT_MS, click, click_tab, fill_form

CONFIG = RunConfig(model="tiny", precisions=("fp32", "mxfp8"), batch_size=1, seq_len=32,
                   steps=1, warmup=0, device="cpu", isolation="inline")


def _pair(values) -> str:
    finite = [v for v in values if v is not None]
    return f"{statistics.median(finite):.1f} / {min(finite):.1f}"


def test_compare_tab_shows_each_trials_sqnr_and_its_layers(qtbot):
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    qtbot.waitExposed(win)
    fill_form(win, CONFIG)
    with qtbot.waitSignal(win.record_shown, timeout=RUN_TIMEOUT_MS) as shown:
        click(win.run_button)
    record = shown.args[0]
    trials = {t.precision: t for t in record.trials}
    mx = trials["mxfp8"]
    assert mx.status == "ok", mx.reason

    click_tab(win.tabs, "Compare")
    view = win.compare_view
    click_tab(view.tables, "Quantisation error (SQNR)")
    tree = view.quant_error.tree
    assert tree.isVisible()
    tops = [tree.topLevelItem(i) for i in range(tree.topLevelItemCount())]
    rows = {item.text(0): item for item in tops}
    assert rows.keys() == {"fp32", "mxfp8"}
    assert rows["fp32"].text(1) == "n/a: nothing is quantised: fp32 weights and inputs"
    layers = mx.quant_error.layers
    loss = mx.summary.final_loss - trials["fp32"].summary.final_loss
    assert [rows["mxfp8"].text(c) for c in range(1, 5)] == [
        str(len(layers)), _pair(r.weight_db for r in layers), _pair(r.input_db for r in layers),
        f"{loss:+.4f}"]
    item = rows["mxfp8"]
    children = {item.child(i).text(0): item.child(i) for i in range(item.childCount())}
    assert children.keys() == {r.name for r in layers}
    block = children["transformer.h.1.mlp.c_fc"]
    assert block.text(1) == "mxfp8 e4m3, e8m0 scale per 32 (RCEIL)"
    layer = next(r for r in layers if r.name == "transformer.h.1.mlp.c_fc")
    assert block.text(2) == f"{layer.weight_db:.2f}" and block.text(3) == f"{layer.input_db:.2f}"
    assert children["lm_head"].text(1) == "bf16 cast (autocast)"  # the tied head stays bf16
