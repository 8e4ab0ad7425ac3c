"""The window on the real engine: tiny preset, CPU, inline trials, a few short steps."""

import json
import multiprocessing
import signal
import threading
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QFileDialog

from engine.core.config import RunConfig
from engine.record.run_record import RunRecord
from engine.run.trial_process import cpu_certain, start_method
from gui.chart_specs import MFU_TITLES
from gui.live_charts import MEASURED_SUFFIX
from gui.main_window import MainWindow
from tests.gui.clicks import (
    RUN_TIMEOUT_MS,
    choose,
    click,
    export,
    fill_form,
    list_item,
    tick,
    type_into,
    wait_for_device,
)


def _config(**changes) -> RunConfig:
    base = RunConfig(model="tiny", precisions=("fp32", "bf16"), batch_size=1, seq_len=16,
                     steps=3, warmup=1, device="cpu", isolation="inline")
    return base.replace(**changes)


@pytest.fixture
def window(qtbot):
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    # the device probe answers from its thread once the window has painted
    qtbot.waitUntil(lambda: not win.config_panel.device_pending(), timeout=RUN_TIMEOUT_MS)
    return win


def test_the_window_shows_before_the_device_probe_answers(qtbot, monkeypatch):
    """Until the probe (torch, CUDA, NVML) answers: "probing device…"; Run is enabled at
    once for the CPU, and the precisions it cannot run are greyed when the probe answers."""
    import engine.measure.device

    release = threading.Event()
    real_probe = engine.measure.device.probe

    def slow_probe(requested="auto"):
        release.wait(RUN_TIMEOUT_MS / 1000)
        return real_probe(requested)

    monkeypatch.setattr(engine.measure.device, "probe", slow_probe)
    win = MainWindow()
    qtbot.addWidget(win)
    win.setVisible(True)  # show() waits for the probe in these tests (conftest)
    qtbot.waitExposed(win)
    qtbot.wait(200)
    panel = win.config_panel
    assert panel.device_pending()
    assert win.device_status.text() == "probing device…"
    assert panel.device.currentText() in ("auto", "cpu")
    assert win.run_button.isEnabled()
    assert "probing device" in panel.error_label.text()
    choose(panel.device, "cuda")  # a GPU is another matter: Run waits for its answer
    assert panel.device_pending() and not win.run_button.isEnabled()
    choose(panel.device, "cpu")
    assert panel.device_pending() and win.run_button.isEnabled()
    assert _precision_item(win, "fp8").flags() & Qt.ItemFlag.ItemIsEnabled  # not checked yet
    release.set()
    qtbot.waitUntil(lambda: not panel.device_pending(), timeout=RUN_TIMEOUT_MS)
    assert "CPU" in win.device_status.text()
    assert win.run_button.isEnabled() and panel.error_label.isHidden()
    assert not _precision_item(win, "tf32").flags() & Qt.ItemFlag.ItemIsEnabled


def test_run_pressed_before_the_probe_answers_runs_on_the_cpu(qtbot, monkeypatch):
    import engine.measure.device

    release = threading.Event()
    real_probe = engine.measure.device.probe
    def slow_probe(requested="auto"):
        if threading.current_thread().name == "ampscope-device-probe":
            release.wait(RUN_TIMEOUT_MS / 1000)  # the window's probe, not the run's
        return real_probe(requested)

    monkeypatch.setattr(engine.measure.device, "probe", slow_probe)
    win = MainWindow()
    qtbot.addWidget(win)
    win.setVisible(True)  # show() waits for the probe in these tests (conftest)
    qtbot.waitExposed(win)
    panel = win.config_panel
    choose(panel.device, "cpu")
    choose(panel.preset, "tiny")
    type_into(panel.seq_len, "16")
    type_into(panel.steps, "2")
    type_into(panel.warmup, "0")
    assert panel.device_pending()
    try:
        with qtbot.waitSignal(win.record_shown, timeout=RUN_TIMEOUT_MS) as blocker:
            click(win.run_button)
            assert panel.device_pending()  # pressed while the probe still had not answered
            # the run waits for the answer (gui/pending_run.py), which now comes
            assert win.run_button.text() == "Waiting for the device…"
            release.set()
    finally:
        release.set()
    record = blocker.args[0]
    assert record.environment["device"]["kind"] == "cpu"
    assert all(t.status in ("ok", "unsupported") for t in record.trials)


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
    return list_item(win.config_panel.precisions, name)


def test_window_opens_with_device_status(window):
    assert window.tabs.count() >= 4
    assert [window.tabs.tabText(i) for i in range(4)] == ["Run", "Compare", "Model", "History"]
    status = window.device_status.text()
    assert "CPU" in status and "NVML" in status
    assert f"bf16: {window.config_panel.device_info.bf16_text}" in status
    assert "fp8: emulated" in status  # float8 runs on the CPU, not on fp8 hardware
    assert "fp8-rowwise (emulated): the CPU has no fp8 matrix unit" in (
        window.device_status.toolTip())
    assert window.run_button.isEnabled()
    assert not window.stop_button.isEnabled()


def test_precisions_the_cpu_cannot_run_are_greyed_with_reason(window):
    item = _precision_item(window, "tf32")
    assert not item.flags() & Qt.ItemFlag.ItemIsEnabled
    assert item.checkState() == Qt.CheckState.Unchecked
    assert "tf32 cannot run here" in item.toolTip() and item.text() == "tf32"
    assert window.config_panel.device_info.unsupported_reason("tf32") in item.toolTip()
    assert _precision_item(window, "bf16").flags() & Qt.ItemFlag.ItemIsEnabled


def test_precisions_the_cpu_runs_emulated_are_marked_and_can_be_ticked(window):
    panel = window.config_panel
    for name in ("fp8", "fp8-rowwise", "fp8-rowwise-gw-hp"):
        item = _precision_item(window, name)
        assert item.text() == f"{name} (emulated)" and item.font().italic()
        assert "runs emulated here" in item.toolTip() and "fp8 matrix unit" in item.toolTip()
        tick(panel.precisions, name)
        assert name in panel.checked_precisions()
    texts = json.loads((Path(__file__).resolve().parents[2] / "resources" /
                        "precisions.json").read_text())
    for name in ("fp32", "bf16-amp"):  # native on the CPU: plain, not marked
        item = _precision_item(window, name)
        assert item.text() == name and not item.font().italic()
        assert item.toolTip() == f"{name}: {texts[name]}"  # what it trains, nothing more


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
        # every step counts, the untimed memory and profiled steps included
        assert window.trial_table.progress(p) == per_trial + 1 + int(config.profile_step)
    # the host monitor ran during the run
    assert window.charts.curve_points("monitor_util", "CPU %") > 0
    # the CPU has no datasheet peak: MFU divides by the measured matmul peak, named so in
    # the live chart's title and the Compare tab's, one dashed curve per precision
    for p in config.precisions:
        assert window.charts.curve_points("mfu", f"{p} {MEASURED_SUFFIX}") == per_trial
        assert window.charts.curve_points("mfu", p) == 0
    assert window.charts.plots["mfu"].titleLabel.text == MFU_TITLES["measured"]
    assert window.compare_view.plots["mfu"].titleLabel.text == MFU_TITLES["measured"]

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
    path = export(qtbot, window, tmp_path / "run.json")
    assert path.exists()
    for kind in ("html", "csv"):
        assert export(qtbot, window, tmp_path / f"run.{kind}").stat().st_size > 0

    other = MainWindow()
    qtbot.addWidget(other)
    with qtbot.waitSignal(other.record_shown, timeout=RUN_TIMEOUT_MS):
        assert other.open_report(path)
    assert other.record.run_id == record.run_id
    assert other.compare_view.table_tsv() == live_table
    assert other.model_view.params.rowCount() == live_params
    assert other.charts.curve_points("loss", "bf16") == live_points
    assert other.trial_table.cell_text("bf16", "Status") == "ok"


def _open_through_file_menu(window, monkeypatch, path) -> None:
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(path), "")))
    file_menu = window.menuBar().actions()[0].menu()
    open_action = next(a for a in file_menu.actions() if a.text().startswith("&Open"))
    open_action.trigger()


def test_opening_a_file_that_is_not_a_report_says_so(qtbot, window, tmp_path, monkeypatch):
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    with qtbot.waitSignal(window.open_failed, timeout=RUN_TIMEOUT_MS):
        _open_through_file_menu(window, monkeypatch, bad)
    assert "not an AmpScope report" in window.log.toPlainText()


def test_a_report_is_read_off_the_gui_thread_with_progress(qtbot, window, tmp_path,
                                                           monkeypatch):
    """A 50 MB report takes seconds to parse: the window reads it in a thread."""
    import engine.record.json_report as json_io
    from engine.report.json_io import write_json
    from tests.engine.sample_record import make_record

    path = write_json(make_record(), tmp_path / "big.json")
    readers = []
    real_read = json_io.read_json

    def read_and_note_thread(p):
        readers.append(threading.current_thread())
        return real_read(p)

    monkeypatch.setattr(json_io, "read_json", read_and_note_thread)
    stages = []
    window.report_loader.progress.connect(lambda stage, pct: stages.append((stage, pct)))
    with qtbot.waitSignal(window.record_shown, timeout=RUN_TIMEOUT_MS) as blocker:
        _open_through_file_menu(window, monkeypatch, path)
    assert readers and readers[0] is not threading.main_thread()
    assert [pct for _, pct in stages] == [0, 60, 100]
    record = blocker.args[0]
    for p in ("fp32", "bf16-amp"):
        assert window.charts.curve_points("loss", p) == len(record.trial(p).steps)
        assert window.charts.curve_points("loss", f"{p} warm-up") == sum(
            s.warmup for s in record.trial(p).steps)


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
    _precision_item(first, "fp16-amp").setCheckState(Qt.CheckState.Unchecked)  # a default
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


def test_app_main_opens_the_window_and_returns_when_it_closes(qapp, monkeypatch):
    from PySide6.QtCore import QTimer

    import gui.app
    from gui.app import main

    started = []  # the trials' server starts with the window (a no-op where a GPU is)
    real = gui.app.start_server
    monkeypatch.setattr(gui.app, "start_server",
                        lambda device: started.append((device, real(device))))

    shown = []

    def close_windows():
        for w in qapp.topLevelWidgets():
            if isinstance(w, MainWindow) and w.isVisible():
                shown.append(w)
                w.close()
        qapp.quit()  # ends the loop even if no window opened, so the test cannot hang

    # repeats: show() itself waits for the device probe (conftest), and a quit() before
    # main's event loop starts would be lost
    closer = QTimer()
    closer.timeout.connect(close_windows)
    closer.start(50)
    try:
        assert main([]) == 0
    finally:
        closer.stop()
    assert len(shown) == 1
    assert started == [("auto", cpu_certain("auto") and start_method("cpu") == "forkserver")]


def _trial_processes():
    return [c for c in multiprocessing.active_children() if c.name.startswith("ampscope-trial")]


def test_closing_while_a_trial_loads_ends_its_process(qtbot):
    win = MainWindow()
    win.show()
    assert win.start_run(_config(isolation="process", steps=100_000, warmup=0))
    qtbot.waitUntil(lambda: len(_trial_processes()) == 1, timeout=RUN_TIMEOUT_MS)
    child = _trial_processes()[0]
    pid = child.pid
    assert win.trial_table.progress("fp32") == 0  # still loading: no step has come back
    win.close()
    assert not win.worker.is_running()
    # 100,000 steps cannot have finished: the child ended at the window's cancel (a forked
    # CPU trial is past its imports and sees it) or was ended by the window (SIGTERM)
    assert child.exitcode in (0, -signal.SIGTERM)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert _trial_processes() == []


def test_run_and_numerics_lab_wait_for_each_other(qtbot, window):
    lab_button = window.numerics_view.run_button
    assert lab_button.isEnabled()
    assert window.start_run(_config(steps=100_000, warmup=0))
    assert not lab_button.isEnabled()  # its GPU work would skew the trial's timings
    qtbot.waitUntil(lambda: window.trial_table.progress("fp32") >= 1, timeout=RUN_TIMEOUT_MS)
    with qtbot.waitSignal(window.record_shown, timeout=RUN_TIMEOUT_MS):
        QTest.mouseClick(window.stop_button, Qt.MouseButton.LeftButton)
    assert lab_button.isEnabled() and window.run_button.isEnabled()

    panel = window.config_panel
    panel.batch_size.setValue(1)
    panel.seq_len.setValue(16)
    bar = window.tabs.tabBar()
    QTest.mouseClick(bar, Qt.MouseButton.LeftButton,
                     pos=bar.tabRect(window.tabs.indexOf(window.numerics_view)).center())
    with qtbot.waitSignal(window.lab_worker.finished, timeout=RUN_TIMEOUT_MS):
        QTest.mouseClick(lab_button, Qt.MouseButton.LeftButton)
        assert not window.run_button.isEnabled()
        # the lab runs in its own process, like a trial: a CUDA error there stays there
        qtbot.waitUntil(lambda: [c.name for c in multiprocessing.active_children()
                                 if c.name == "ampscope-numerics"] == ["ampscope-numerics"],
                        timeout=RUN_TIMEOUT_MS)
        assert not window.start_run(_config())
    qtbot.waitUntil(window.run_button.isEnabled)
    assert window.numerics_view.numerics["precision"]


def _fake_gpu(monkeypatch, **props):
    """torch.cuda answering as on one real GPU (the fields get_device_properties gives)."""
    import torch

    device = SimpleNamespace(multi_processor_count=108, total_memory=80 * 2**30, **props)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=0: device)
    monkeypatch.setattr(torch.version, "cuda", None if "gcnArchName" in props else "12.9")


@pytest.mark.parametrize(("props", "greyed", "runs"), [
    (dict(name="NVIDIA A100-SXM4-80GB", major=8, minor=0), ("fp8", "fp8-rowwise"),
     ("bf16-amp", "tf32")),
    (dict(name="AMD Instinct MI300X", major=9, minor=4, gcnArchName="gfx942:sramecc+:xnack-"),
     (), ("fp8", "fp8-rowwise-gw-hp", "tf32")),
])
def test_choosing_a_gpu_greys_what_its_hardware_cannot_run(window, monkeypatch, props, greyed,
                                                           runs):
    _fake_gpu(monkeypatch, **props)
    panel = window.config_panel
    choose(panel.device, "cuda")
    wait_for_device(panel)
    assert panel.device_info.name == props["name"]
    for name in greyed:
        item = _precision_item(window, name)
        assert not item.flags() & Qt.ItemFlag.ItemIsEnabled
        assert "compute capability 8.0" in item.toolTip()
    for name in runs:
        item = _precision_item(window, name)
        assert item.flags() & Qt.ItemFlag.ItemIsEnabled
        assert item.text() == name and not item.font().italic()  # native, not emulated
