"""Screenshots of every view for the docs: a real tiny-preset run on the CPU, offscreen,
and a GPU server's report opened beside it.

    python scripts/screenshots.py [--out docs/screenshots] [--report h200-report.json]

Settings and history go to a temporary folder, never to the user's.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from PySide6.QtCore import QEventLoop, QSettings, Qt, QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

PRECISIONS = ("fp32", "bf16-amp", "fp16-amp", "bf16")
SIZE = (1366, 768)  # a common laptop screen: the window must fit it
WAIT_MS = 1_800_000  # a busy machine: the run of four precisions once took over 10 min


def _wait_for(signal) -> None:
    loop = QEventLoop()
    signal.connect(loop.quit)
    timer = QTimer(singleShot=True, interval=WAIT_MS)
    timer.timeout.connect(loop.quit)
    timer.start()
    loop.exec()
    signal.disconnect(loop.quit)
    if not timer.isActive():
        raise SystemExit("gave up waiting: the run or the lab did not finish")


def _settle(app: QApplication) -> None:
    """Let layouts, the 15 Hz chart timer and repaints catch up before grabbing."""
    loop = QEventLoop()
    QTimer.singleShot(400, loop.quit)
    loop.exec()
    app.processEvents()


def _shoot_report(app: QApplication, window, report: str, out: Path) -> None:
    """File > Open of a server's report, as a user does; its Run and Compare tabs."""
    window.open_report(report)
    _wait_for(window.record_shown)
    for name, tab in {"run-gpu": window.tabs.widget(0),
                      "compare-gpu": window.compare_view}.items():
        window.tabs.setCurrentWidget(tab)
        _settle(app)
        window.grab().save(str(out / f"{name}.png"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    parser.add_argument("--report", help="a report from a GPU server (e.g. the H200's): the "
                        "Run and Compare tabs are also shot with it open, as run-gpu.png and "
                        "compare-gpu.png")
    parser.add_argument("--only-report", action="store_true",
                        help="shoot only the two views with --report open (no CPU run)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="ampscope-shots-"))
    os.environ["AMPSCOPE_DATA_DIR"] = str(scratch / "data")
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(scratch))

    app = QApplication(sys.argv[:1])
    from engine.core.config import RunConfig
    from gui.main_window import MainWindow

    window = MainWindow()
    window.resize(*SIZE)
    window.show()
    if args.only_report:
        if not args.report:
            raise SystemExit("--only-report needs --report")
        _wait_for(window.ready)
        while window.config_panel.device_pending():  # the status bar names this machine too
            _settle(app)
        _shoot_report(app, window, args.report, out)
        window.close()
        print(f"screenshots written to {out}")
        return 0
    panel = window.config_panel
    config = RunConfig(model="tiny", precisions=PRECISIONS, batch_size=2, seq_len=32, steps=20,
                       warmup=2, device="cpu", isolation="inline")
    panel.set_values(config.to_dict())
    window.start_run(config)
    _wait_for(window.record_shown)

    shots = {"run": window.tabs.widget(0), "compare": window.compare_view,
             "model": window.model_view, "kernels": window.kernel_view}
    # tied weights first, so the picture shows how they are marked
    window.model_view.param_table.sortByColumn(7, Qt.SortOrder.DescendingOrder)
    for name, tab in shots.items():
        window.tabs.setCurrentWidget(tab)
        _settle(app)
        window.grab().save(str(out / f"{name}.png"))

    # the Compare tab's memory timeline: choosing its tab gives it the room it needs
    compare = window.compare_view
    window.tabs.setCurrentWidget(compare)
    compare.tables.setCurrentWidget(compare.timeline)
    _settle(app)
    window.grab().save(str(out / "compare-timeline.png"))
    compare.tables.setCurrentIndex(0)

    window.numerics_view.precision.setCurrentText("fp16-amp")
    window.start_lab("fp16-amp")
    _wait_for(window.lab_worker.finished)
    window.tabs.setCurrentWidget(window.numerics_view)
    _settle(app)
    window.grab().save(str(out / "numerics.png"))

    if args.report:
        _shoot_report(app, window, args.report, out)

    history = window.history_view
    history.refresh()
    history.tree.expandAll()
    run_id = history.run_ids()[0]
    history.set_checked(run_id, "fp32")
    history.set_checked(run_id, "bf16")
    window.tabs.setCurrentWidget(history)
    _settle(app)
    window.grab().save(str(out / "history.png"))

    plan = window.plan_view  # GPT-2 traced on fake tensors, planned for an RTX 4090
    plan.model.setText("gpt2")
    plan.precisions.setText("fp32,bf16-amp")
    plan.batch.setValue(4)
    plan.seq.setValue(512)
    plan.checkpointing.setChecked(True)
    plan.cards.setText("RTX 4090")
    plan.max_batch.setValue(0)
    plan.start_plan()
    _wait_for(plan.worker.finished)
    window.tabs.setCurrentWidget(plan)
    _settle(app)
    window.grab().save(str(out / "plan.png"))
    window.close()
    print(f"screenshots written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
