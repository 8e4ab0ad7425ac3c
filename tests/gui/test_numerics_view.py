"""The Numerics tab runs the real lab (tiny preset, CPU) and shows a report's numerics."""

import pytest

from engine.record.run_record import RunRecord
from gui.main_window import MainWindow

LAB_TIMEOUT_MS = 300_000


@pytest.fixture
def window(qtbot):
    win = MainWindow()
    qtbot.addWidget(win)
    panel = win.config_panel
    panel.device.setCurrentText("cpu")
    panel.batch_size.setValue(1)
    panel.seq_len.setValue(16)
    return win


def test_lab_fills_every_panel(qtbot, window):
    view = window.numerics_view
    with qtbot.waitSignal(window.lab_worker.finished, timeout=LAB_TIMEOUT_MS):
        assert window.start_lab("fp16-amp")
    numerics = view.numerics
    assert numerics["precision"] == "fp16-amp"
    assert view.formats.rowCount() == len(numerics["formats"]) > 0
    assert view.demos.rowCount() == len(numerics["demos"]) > 0
    assert view.trace.rowCount() == len(numerics["op_trace"]["ops"]) > 0
    assert numerics["advice"]["recommended"] in view.advice.toPlainText()
    histogram = [i for i in view.histogram.listDataItems() if i.xData is not None]
    assert len(histogram) == 1
    # one band pair (subnormal, normal) per format range
    assert len(view.bands.items) >= 2 * len(numerics["gradients"]["format_ranges"])
    assert view.run_button.isEnabled()


def test_an_unsupported_precision_is_reported_not_raised(qtbot, window):
    with qtbot.waitSignal(window.lab_worker.errored, timeout=LAB_TIMEOUT_MS) as blocker:
        window.start_lab("tf32")
    assert "tf32 cannot run on this device" in blocker.args[0]
    assert "tf32 cannot run" in window.numerics_view.status.text()
    assert window.numerics_view.run_button.isEnabled()


def test_a_report_with_numerics_shows_them(qtbot, window):
    with qtbot.waitSignal(window.lab_worker.finished, timeout=LAB_TIMEOUT_MS) as blocker:
        window.start_lab("bf16")
    record = RunRecord(run_id="withlab", config={"model": "tiny"}, status="ok",
                       numerics=blocker.args[0])
    other = MainWindow()
    qtbot.addWidget(other)
    other.show_record(RunRecord.from_dict(record.to_dict()))
    assert other.numerics_view.demos.rowCount() == window.numerics_view.demos.rowCount()
    assert other.numerics_view.numerics["precision"] == "bf16"

    other.show_record(RunRecord(run_id="nolab", status="ok"))
    assert other.numerics_view.numerics is None
    assert other.numerics_view.demos.rowCount() == 0
    assert "no numerics" in other.numerics_view.status.text()
