"""The window's menu bar: File (open, watch, export run and charts, quit), Run (run,
stop, run with kernel traces, measure the matmul peak again) and Help (About: the versions
in use). Each action calls what the window already offers; the menus hold no state."""

from __future__ import annotations

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QFileDialog

from gui.about import show_about
from gui.open_export import REPORT_FILTERS
from gui.quit_guard import quit_asked


def build_menus(window) -> None:
    """Add the File and Run menus to ``window`` (a ``MainWindow``)."""
    files, watch = window.open_export, window.watch
    file_menu = window.menuBar().addMenu("&File")
    open_action = QAction("&Open report or journal…", window)
    open_action.setShortcut(QKeySequence.StandardKey.Open)
    open_action.triggered.connect(files.ask_open_report)
    file_menu.addAction(open_action)
    watch_action = QAction("&Watch run…", window)
    watch_action.setStatusTip("Follow a run journal live (a run recorded with the "
                              "ampscope module, or any AmpScope run)")
    watch_action.triggered.connect(watch.ask_watch_run)
    file_menu.addAction(watch_action)
    export_menu = file_menu.addMenu("&Export run as")
    for kind, label in REPORT_FILTERS.items():
        action = QAction(label.split(" (")[0] + "…", window)
        action.triggered.connect(lambda _=False, k=kind: files.ask_export_run(k))
        export_menu.addAction(action)
    chart_menu = file_menu.addMenu("Export &chart")
    for key, title in window.chart_titles().items():
        action = QAction(title + "…", window)
        action.triggered.connect(lambda _=False, k=key: files.ask_export_chart(k))
        chart_menu.addAction(action)
    file_menu.addSeparator()
    quit_action = QAction("&Quit", window)
    quit_action.setShortcut(QKeySequence.StandardKey.Quit)
    quit_action.triggered.connect(lambda: quit_asked(window))  # asks during a run
    file_menu.addAction(quit_action)

    run_menu = window.menuBar().addMenu("&Run")
    start = QAction("&Run", window)
    start.setShortcut("Ctrl+R")
    start.triggered.connect(lambda: window._run_clicked())  # waits, as the button does
    stop = QAction("&Stop", window)
    stop.triggered.connect(window.stop_run)
    traced = QAction("Run with &kernel traces…", window)
    traced.triggered.connect(lambda: ask_traced_run(window))
    peak = QAction("&Measure matmul peak again", window)
    peak.triggered.connect(window.peak_status.measure)
    run_menu.addActions([start, stop, traced])
    run_menu.addSeparator()
    run_menu.addAction(peak)

    help_menu = window.menuBar().addMenu("&Help")
    about = QAction("&About AmpScope…", window)
    about.triggered.connect(lambda: show_about(window))
    help_menu.addAction(about)


def ask_traced_run(window) -> None:
    """Run the form's config, writing each profiled step's Chrome trace to a folder."""
    folder = QFileDialog.getExistingDirectory(window, "Folder for the kernel traces")
    if not folder:
        return
    try:
        config = window.config_panel.config().replace(trace_dir=folder, profile_step=True)
    except ValueError as exc:
        window.log_line("error", str(exc))
        return
    if window.start_run(config):
        window.log_line("info", f"profiled steps will be written to {folder} as "
                        "<precision>.trace.json (open in ui.perfetto.dev)")
