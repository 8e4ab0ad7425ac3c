"""The window on the real engine: tiny preset, CPU, inline trials, a few short steps."""

import threading

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication

from engine.config import RunConfig
from engine.record import RunRecord
from gui.main_window import MainWindow
from tests.gui.clicks import RUN_TIMEOUT_MS, click, fill_form


def _config(**changes) -> RunConfig:
    base = RunConfig(model="tiny", precisions=("fp32", "bf16"), batch_size=1, seq_len=16,
                     steps=3, warmup=1, device="cpu", isolation="inline")
    return base.replace(**changes)


@pytest.fixture
def window(qtbot):
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    return win


def _run(qtbot, win: MainWindow, config: RunConfig) -> RunRecord:
    """Configure the form through its widgets and click Run."""
    fill_form(win, config)
    with qtbot.waitSignal(win.record_shown, timeout=RUN_TIMEOUT_MS) as blocker:
        click(win.run_button)
    return blocker.args[0]


def _run_config(qtbot, win: MainWindow, config: RunConfig) -> RunRecord:
    """For configs the form refuses on purpose (a greyed precision, a model not in the
    cache): what is checked is how the window reports the engine's answer."""
    with qtbot.waitSignal(win.record_shown, timeout=RUN_TIMEOUT_MS) as blocker:
        assert win.start_run(config)
    return blocker.args[0]


def _precision_item(win: MainWindow, name: str):
    items = win.config_panel.precisions.findItems(name, Qt.MatchFlag.MatchExactly)
    assert len(items) == 1
    return items[0]


def test_window_opens_with_device_status(window):
    assert window.tabs.count() >= 4
    assert [window.tabs.tabText(i) for i in range(4)] == ["Run", "Compare", "Model", "History"]
    status = window.device_status.text()
    assert "CPU" in status and "NVML" in status and "bf16: yes" in status
    assert window.run_button.isEnabled()
    assert not window.stop_button.isEnabled()


def test_precisions_the_cpu_cannot_run_are_greyed_with_reason(window):
    for name in ("tf32", "fp8"):
        item = _precision_item(window, name)
        assert not item.flags() & Qt.ItemFlag.ItemIsEnabled
        assert item.checkState() == Qt.CheckState.Unchecked
        assert window.config_panel.device_info.unsupported_reason(name) in item.toolTip()
    assert _precision_item(window, "bf16").flags() & Qt.ItemFlag.ItemIsEnabled


def test_invalid_input_shows_inline_and_disables_run(window):
    panel = window.config_panel
    for i in range(panel.precisions.count()):
        panel.precisions.item(i).setCheckState(Qt.CheckState.Unchecked)
    assert not panel.error_label.isHidden()
    assert "no precision given" in panel.error_label.text()
    assert not window.run_button.isEnabled()
    _precision_item(window, "fp32").setCheckState(Qt.CheckState.Checked)
    assert panel.error_label.isHidden()
    assert window.run_button.isEnabled()


def test_run_fills_live_charts_comparison_model_and_history(qtbot, window):
    config = _config()
    record = _run(qtbot, window, config)

    assert record.status == "ok"
    assert [t.status for t in record.trials] == ["ok", "ok"]
    per_trial = config.warmup + config.steps
    for p in config.precisions:
        assert window.charts.curve_points("loss", p) == per_trial
        assert window.charts.curve_points("step_time", p) == per_trial
        assert window.trial_table.cell_text(p, "Status") == "ok"
        assert window.trial_table.progress(p) == per_trial
    # the host monitor ran during the run
    assert window.charts.curve_points("monitor_util", "CPU %") > 0

    table = window.compare_view.proxy
    assert table.rowCount() == 2
    assert {table.index(r, 0).data() for r in range(2)} == {"fp32", "bf16"}
    assert window.model_view.params.rowCount() > 0
    assert window.model_view.modules.rowCount() == 1  # the model root
    assert [e.id for e in window.history.list()] == [record.run_id]


def test_forced_unsupported_precision_shows_its_reason_on_its_row(qtbot, window):
    record = _run_config(qtbot, window, _config(precisions=("tf32",)))
    reason = window.config_panel.device_info.unsupported_reason("tf32")
    assert record.trial("tf32").status == "unsupported"
    assert window.trial_table.cell_text("tf32", "Status") == "unsupported"
    assert window.trial_table.cell_text("tf32", "Reason") == reason
    assert reason in window.log.toPlainText()
    tsv = window.compare_view.table_tsv()
    assert "unsupported" in tsv and reason in tsv


def test_stop_mid_run_cancels_and_keeps_measured_steps(qtbot, window):
    config = _config(steps=100_000, warmup=0)
    fill_form(window, config)
    click(window.run_button)
    qtbot.waitUntil(lambda: window.trial_table.progress("fp32") >= 2, timeout=RUN_TIMEOUT_MS)
    with qtbot.waitSignal(window.record_shown, timeout=RUN_TIMEOUT_MS) as blocker:
        click(window.stop_button)
    record = blocker.args[0]
    assert record.status == "cancelled"
    fp32 = record.trial("fp32")
    assert fp32.status == "cancelled"
    assert 2 <= len(fp32.steps) < config.steps
    assert record.trial("bf16").status == "cancelled"
    assert window.charts.curve_points("loss", "fp32") == len(fp32.steps)
    assert window.trial_table.cell_text("fp32", "Status") == "cancelled"
    assert window.run_button.isEnabled()


def test_closing_mid_run_leaves_no_thread_running(qtbot):
    win = MainWindow()
    win.show()
    assert win.start_run(_config(steps=100_000, warmup=0))
    qtbot.waitUntil(lambda: win.trial_table.progress("fp32") >= 1, timeout=RUN_TIMEOUT_MS)
    win.close()
    assert not win.worker.is_running()
    names = {t.name for t in threading.enumerate()}
    assert "ampscope-run" not in names
    assert "ampscope-monitor" not in names


def test_export_then_open_shows_the_same_views(qtbot, window, tmp_path):
    record = _run(qtbot, window, _config())
    live_table = window.compare_view.table_tsv()
    live_params = window.model_view.params.rowCount()
    live_points = window.charts.curve_points("loss", "bf16")
    path = window.export_run(tmp_path / "run.json")
    assert path is not None and path.exists()
    for kind in ("html", "csv"):
        assert window.export_run(tmp_path / f"run.{kind}").stat().st_size > 0

    other = MainWindow()
    qtbot.addWidget(other)
    with qtbot.waitSignal(other.record_shown, timeout=RUN_TIMEOUT_MS):
        assert other.open_report(path)
    assert other.record.run_id == record.run_id
    assert other.compare_view.table_tsv() == live_table
    assert other.model_view.params.rowCount() == live_params
    assert other.charts.curve_points("loss", "bf16") == live_points
    assert other.trial_table.cell_text("bf16", "Status") == "ok"


def test_opening_a_file_that_is_not_a_report_says_so(window, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    assert not window.open_report(bad)
    assert "not an AmpScope report" in window.log.toPlainText()


def test_copy_puts_the_table_on_the_clipboard_as_tsv(qtbot, window):
    _run(qtbot, window, _config(precisions=("fp32",)))
    window.compare_view.copy_table()
    text = QGuiApplication.clipboard().text()
    lines = text.strip().split("\n")
    assert lines[0].split("\t")[:4] == ["Precision", "Status", "Trained params", "Step time"]
    assert lines[1].startswith("fp32\tok\t")


def test_charts_export_as_png_and_svg(qtbot, window, tmp_path):
    _run(qtbot, window, _config(precisions=("fp32",)))
    png = window.export_chart("live/loss", tmp_path / "loss.png")
    svg = window.export_chart("compare/memory", tmp_path / "memory.svg")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in svg.read_text()
    with pytest.raises(ValueError, match="use .png or .svg"):
        window.export_chart("live/loss", tmp_path / "loss.gif")


def test_settings_persist_between_windows(qtbot, tmp_path):
    first = MainWindow()
    qtbot.addWidget(first)
    first.config_panel.steps.setValue(7)
    first.config_panel.optimizer.setCurrentText("sgd")
    _precision_item(first, "bf16-amp").setCheckState(Qt.CheckState.Checked)
    first.close()
    assert list((tmp_path / "cfg").rglob("*.ini"))  # written to the test's folder

    second = MainWindow()
    qtbot.addWidget(second)
    values = second.config_panel.form_values()
    assert values["steps"] == 7
    assert values["optimizer"] == "sgd"
    assert values["precisions"] == ["fp32", "bf16-amp"]


def test_a_model_that_cannot_load_is_reported_once_and_the_window_stays_usable(qtbot, window):
    record = _run_config(qtbot, window, _config(model="no-such-org/no-such-model"))
    assert record.status == "error"
    log = window.log.toPlainText()
    assert log.count("no-such-org/no-such-model' is not a preset") == 1
    assert window.trial_table.cell_text("fp32", "Status") == "not run"
    assert "is not a preset" in window.trial_table.cell_text("fp32", "Reason")
    assert window.run_button.isEnabled()
    assert window.history.list() == []  # a run that never started is not history


def test_app_main_opens_the_window_and_returns_when_it_closes(qapp):
    from PySide6.QtCore import QTimer

    from gui.app import main

    shown = []

    def close_windows():
        shown.extend(w for w in qapp.topLevelWidgets()
                     if isinstance(w, MainWindow) and w.isVisible())
        for w in shown:
            w.close()
        qapp.quit()  # ends the loop even if no window opened, so the test cannot hang

    QTimer.singleShot(0, close_windows)
    assert main([]) == 0
    assert len(shown) == 1
