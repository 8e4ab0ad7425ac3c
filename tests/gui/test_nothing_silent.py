"""Nothing silent: a batch too big for the machine is kept as typed and refused at Run with
the predicted memory against the free memory (window and CLI); the numerics lab says which
batch it uses, shows that it is running and stops on request."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from tests.gui.clicks import choose, click, click_tab, shown_window, type_into

ROOT = Path(__file__).resolve().parents[2]
HUGE = 999_999_999
GIB = 2**30
GPT2 = {"vocab": 50257, "seq": 128}  # gpt2's config: vocabulary; the form's default sequence


@pytest.fixture
def window(qtbot):
    win = shown_window(qtbot)
    panel = win.config_panel
    choose(panel.device, "cpu")
    # choosing a device probes it again, and a Run clicked meanwhile waits for the answer:
    # a person acts once the window says what the device is
    qtbot.waitUntil(lambda: not panel.device_pending(), timeout=60_000)
    return win


def _figures(text: str) -> tuple[float, float]:
    """(predicted GiB, free GiB) as the refusal writes them."""
    found = re.search(r"predicted to need ([\d,.]+) GiB .* has ([\d,.]+) GiB free", text)
    assert found, text
    return tuple(float(g.replace(",", "")) for g in found.groups())


def _check_figures(text: str) -> None:
    predicted, free = _figures(text)
    # at least the loss's gradient of the fp32 logits: batch × seq × vocab × 4 B, twice
    # (the logits' and their log-softmax's), in GiB
    assert predicted >= 2 * HUGE * GPT2["seq"] * GPT2["vocab"] * 4 / GIB
    available = psutil.virtual_memory().available / GIB
    assert free == pytest.approx(available, rel=0.25)


def test_a_huge_batch_is_kept_as_typed_and_refused_with_the_figures(qtbot, window):
    panel = window.config_panel
    choose(panel.preset, "gpt2")
    type_into(panel.batch_size, str(HUGE))
    QTest.keyClick(panel.batch_size, Qt.Key.Key_Tab)
    assert panel.batch_size.value() == HUGE  # not clamped to a ceiling without a word
    click(window.run_button)
    assert not window.worker.is_running()
    notice = window.notice
    assert notice.isVisible() and notice.text().startswith("Run refused: the fp32 trial is "
                                                            "predicted to need")
    assert 'lower "Batch size"' in notice.text()  # in the form's words, not the CLI's
    _check_figures(notice.text())
    assert notice.label.height() >= notice.label.heightForWidth(notice.label.width())
    assert "Run refused" in window.log.toPlainText()


def test_the_cli_refuses_a_run_bigger_than_the_free_memory():
    cli = subprocess.run(
        [sys.executable, "main.py", "profile", "--model", "gpt2", "--precision", "fp32",
         "--device", "cpu", "--batch-size", str(HUGE), "--steps", "1", "--warmup", "0",
         "--quiet"], cwd=ROOT, capture_output=True, text=True)
    assert cli.returncode == 2, cli.stdout + cli.stderr
    line = cli.stderr.strip().splitlines()[-1]
    assert line.startswith("ampscope: error: the fp32 trial is predicted to need")
    _check_figures(line)


def test_the_lab_says_its_batch_shows_progress_and_stops(qtbot, window):
    panel = window.config_panel
    type_into(panel.batch_size, "3")
    type_into(panel.seq_len, "16")
    QTest.keyClick(panel.seq_len, Qt.Key.Key_Tab)
    click_tab(window.tabs, "Numerics")
    view = window.numerics_view
    assert view.uses.isVisible()
    assert "batch 3 × 16 tokens, on cpu" in view.uses.text()
    assert view.uses.text().startswith("Uses the Run tab's settings: tiny")
    assert not view.stop_button.isVisible()
    click(view.run_button)
    assert view.progress.isVisible() and view.stop_button.isVisible()
    qtbot.waitUntil(lambda: "s so far" in view.status.text(), timeout=5_000)
    assert "batch 3 × 16 tokens" in view.status.text()
    with qtbot.waitSignal(window.lab_worker.stopped, timeout=60_000):
        click(view.stop_button)
    qtbot.waitUntil(lambda: not window.lab_worker.is_running(), timeout=10_000)
    assert view.status.text().startswith("Numerics lab stopped")
    assert not view.progress.isVisible() and not view.stop_button.isVisible()
    assert view.run_button.isEnabled() and window.run_button.isEnabled()


def test_the_lab_refuses_a_batch_bigger_than_the_free_memory(qtbot, window):
    panel = window.config_panel
    choose(panel.preset, "gpt2")
    type_into(panel.batch_size, str(HUGE))
    QTest.keyClick(panel.batch_size, Qt.Key.Key_Tab)
    click_tab(window.tabs, "Numerics")
    view = window.numerics_view
    click(view.run_button)
    assert not window.lab_worker.is_running()
    assert view.status.text().startswith(
        f"Numerics lab refused: the {view.precision.currentText()} trial is predicted to need")
    _check_figures(view.status.text())
    assert window.notice.text() == view.status.text()
