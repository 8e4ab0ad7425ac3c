"""The form's "Training data" field: a path typed that is no file is refused inline with Run
disabled; a text file picked with Browse… is what the run trains on, and the record names it
(tiny preset, CPU, inline)."""

from __future__ import annotations

from PySide6.QtWidgets import QFileDialog

from engine.core.config import RunConfig
from gui.main_window import MainWindow
from tests.gui.clicks import RUN_TIMEOUT_MS, click, fill_form, type_into

RUN = RunConfig(model="tiny", precisions=("fp32",), batch_size=1, seq_len=16, steps=2,
                warmup=1, device="cpu", isolation="inline")


def test_a_bad_path_is_refused_inline_and_a_picked_file_is_trained_on(qtbot, tmp_path,
                                                                      monkeypatch):
    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    fill_form(window, RUN)
    panel = window.config_panel
    assert panel.config().data == "docs"  # the field left empty: the built-in text
    click(panel.profile_step)  # shorter: the run's data is what this test is about
    click(panel.quant_error)

    type_into(panel.data, str(tmp_path / "missing.txt"))
    assert panel.error_label.isVisible()
    assert "missing.txt does not exist" in panel.error_label.text()
    assert not window.run_button.isEnabled()

    text = tmp_path / "notes.txt"
    text.write_text("The quick brown fox jumps over the lazy dog.\n" * 40, encoding="utf-8")
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(text), "")))
    click(panel.browse_data)
    assert panel.data.text() == str(text)
    assert not panel.error_label.isVisible(), panel.error_label.text()
    assert panel.config().data == str(text.resolve())
    assert window.run_button.isEnabled()

    with qtbot.waitSignal(window.record_shown, timeout=RUN_TIMEOUT_MS) as blocker:
        click(window.run_button)
    record = blocker.args[0]
    assert record.trials[0].status == "ok", record.trials[0].reason
    assert record.data.source.startswith("notes.txt (")
    assert record.data.tokenisation.startswith("byte-level")
    assert panel.saved_values()["data"] == str(text)
