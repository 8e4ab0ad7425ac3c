"""Lost updates in the window after a real run from the Run button (tiny preset, CPU): the
Compare table's column, the Numerics lab's per-trial table recomputed here from the trials'
figures, and the master-weights explanation one click away."""

from __future__ import annotations

from engine.core.config import RunConfig
from engine.record.compare import COLUMNS
from gui.main_window import MainWindow
from tests.gui.clicks import RUN_TIMEOUT_MS, click, click_tab, fill_form

CONFIG = RunConfig(model="tiny", precisions=("fp32", "bf16"), batch_size=1, seq_len=16,
                   steps=1, warmup=0, device="cpu", isolation="inline", profile_step=False)


def test_lost_updates_show_in_compare_and_numerics_with_the_explanation(qtbot):
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    qtbot.waitExposed(win)
    fill_form(win, CONFIG)
    with qtbot.waitSignal(win.record_shown, timeout=RUN_TIMEOUT_MS) as shown:
        click(win.run_button)
    trials = {t.precision: t for t in shown.args[0].trials}
    lu = trials["bf16"].lost_updates
    assert lu is not None and trials["fp32"].lost_updates is None

    click_tab(win.tabs, "Compare")
    model = win.compare_view.table.model()
    column = [key for key, _, _ in COLUMNS].index("lost_updates")
    cells = {model.index(r, 0).data(): model.index(r, column).data()
             for r in range(model.rowCount())}
    assert cells["bf16"] == f"{lu.min_lr_norm_share:.0%} at lr {lu.min_lr:g}"
    assert cells["fp32"] == "n/a"

    click_tab(win.tabs, "Numerics")
    view = win.numerics_view
    rows = {view.lost.item(r, 0).text(): r for r in range(view.lost.rowCount())}
    assert rows.keys() == {"fp32", "bf16"}
    r = rows["bf16"]
    assert view.lost.item(r, 2).text() == (
        f"{lu.element_share:.1%} / {lu.norm_share:.1%} (lr {lu.lr:g})")
    assert view.lost.item(r, 3).text() == (
        f"{lu.min_lr_element_share:.1%} / {lu.min_lr_norm_share:.1%} (lr {lu.min_lr:g})")
    assert view.lost.item(rows["fp32"], 1).text().startswith("n/a: the trained weights")
    assert not view.lost_explanation.isVisible()
    click(view.why_lost)
    assert view.lost_explanation.isVisible()
    assert "master copy" in view.lost_explanation.text()
    click(view.why_lost)
    assert not view.lost_explanation.isVisible()
