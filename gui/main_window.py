"""The AmpScope window: configure a run, watch it live, compare, inspect, export, revisit.

Every view is built from a ``RunRecord``: a live run folds the worker's events into one
with ``record.apply`` (charts and the trial table also take each event as it comes),
and an opened report or a history entry is the same kind of record, shown by the same
``show_record`` calls. The window measures and computes nothing itself: it builds the
views and wires them together. Its menus are built by ``gui.menus``; opening and exporting
reports is ``gui.open_export.OpenExport``'s, following another process's journal
``gui.watch_actions.WatchActions``'s; a run's events reach the live views through
``gui.run_events``, the numerics lab runs through ``gui.lab_control``, and the views that
need pyqtgraph are built after the first paint by ``gui.deferred_views``.
"""

from __future__ import annotations

import gc
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from engine.core.config import RunConfig
from engine.core.events import StepSample
from engine.core.versions import warning_line
from engine.record.compare import record_precisions
from engine.record.run_record import RunRecord
from gui import settings
from gui.chart_specs import COMPARE_CHARTS, LIVE_CHARTS
from gui.config_panel import ConfigPanel, in_form_words
from gui.deferred_views import Deferred, DeferredViews
from gui.device_status import DeviceStatus
from gui.fit_view import FitView
from gui.history import HistoryError, HistoryStore
from gui.history_view import HistoryView
from gui.kernel_view import KernelView
from gui.lab_control import LabControl
from gui.menus import build_menus
from gui.model_view import ModelView
from gui.notice_bar import NoticeBar, fit_device_line
from gui.open_export import OpenExport
from gui.peak_status import PeakStatus
from gui.pending_run import PendingRun
from gui.plain_text import as_html
from gui.plan_view import PlanView
from gui.quit_guard import may_quit
from gui.run_events import RunEvents
from gui.run_origin import from_elsewhere, local_device, run_device, run_summary
from gui.trial_table import TrialTable, trial_units
from gui.verdict_banner import VerdictBanner
from gui.watch_actions import WatchActions
from gui.worker import ENGINE_IMPORTS, LabWorker, RunWorker

CLOSE_GRACE_S = 3.0  # closing waits this long for a cancelled trial before ending it


class MainWindow(DeferredViews, RunEvents, LabControl, QMainWindow):
    """The window. Its parts live beside it: gui/deferred_views.py (the views built after
    the first paint), gui/run_events.py (a run's events in the live views),
    gui/lab_control.py (the numerics lab's runs), gui/menus.py, gui/open_export.py and
    gui/watch_actions.py."""

    charts = Deferred()  # the Run tab's live charts
    compare_view = Deferred()
    numerics_view = Deferred()
    ready = Signal()  # every deferred view is built
    record_shown = Signal(object)  # the RunRecord every view now shows
    open_failed = Signal(str)  # a report could not be opened: why
    exported = Signal(object)  # the path a report was written to
    export_failed = Signal(str)  # why a report could not be written

    def __init__(self, history: HistoryStore | None = None) -> None:
        super().__init__()
        self.setWindowTitle("AmpScope")
        self._built: dict[str, QWidget] = {}
        self._holders: dict[str, QWidget] = {}  # deferred view name -> its stand-in
        self.record: RunRecord | None = None
        self._run_error: str | None = None  # why the current run failed, once it has
        self.worker = RunWorker(self)
        self.worker.event.connect(self.show_event)
        self.worker.errored.connect(self._on_errored)
        self.worker.finished.connect(self._on_finished)
        self._latest_steps: dict[str, StepSample] = {}  # per precision, not yet shown
        self._phases: dict[str, list[str]] = {}  # per precision, the phases it went through
        self._rounds = 1  # rounds per precision in the run on show
        self._progress_timer = QTimer(self)
        self._progress_timer.setInterval(100)
        self._progress_timer.timeout.connect(self.show_progress)
        self.history = history or HistoryStore()
        self.open_export = OpenExport(self)  # File > Open, File > Export: off the GUI thread
        self.report_loader = self.open_export.loader
        self.report_writer = self.open_export.writer
        self.watch = WatchActions(self)  # File > Watch run: a journal another process writes

        # the device probe (torch) waits for the chart views: both at once contend for the GIL
        self.config_panel = ConfigPanel(probe_on_paint=False)
        self.run_button = QPushButton("Run")
        self.run_button.setDefault(True)
        # clicked(bool) would land in start_run's config parameter
        self.run_button.clicked.connect(self._run_clicked)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(self.stop_run)
        self.pending_run = PendingRun(self)  # Run pressed before the engine has loaded
        scroll = QScrollArea()
        scroll.setWidget(self.config_panel)
        scroll.setWidgetResizable(True)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setMinimumWidth(self.config_panel.sizeHint().width() + 24)
        # Run, Stop and why Run is disabled stay in view however small the screen: only
        # the form above them scrolls
        buttons = QHBoxLayout()
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.stop_button)
        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        # a run from another machine on show: the form is not that run's, and says so
        self.origin_banner = QLabel()
        self.origin_banner.setObjectName("origin")
        self.origin_banner.setTextFormat(Qt.TextFormat.PlainText)
        self.origin_banner.setWordWrap(True)
        self.origin_banner.setStyleSheet("QLabel#origin { background: #EAF2FB; border: 1px "
                                         "solid #9DBFE3; border-radius: 4px; padding: 4px; }")
        self.origin_banner.hide()
        left_layout.addWidget(self.origin_banner)
        left_layout.addWidget(scroll, 1)
        left_layout.addWidget(self.config_panel.error_label)
        left_layout.addLayout(buttons)

        self.trial_table = TrialTable()
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(5000)
        lower = QTabWidget()
        lower.addTab(self.trial_table, "Trials")
        lower.addTab(self.log, "Log")
        self.lower_tabs = lower
        right = QSplitter(Qt.Orientation.Vertical)
        right.addWidget(self._holder("charts"))
        right.addWidget(lower)
        right.setStretchFactor(0, 3)
        right.setStretchFactor(1, 1)
        right.setSizes([640, 220])
        # the verdict of the run that ended, above the charts it was watched on
        self.verdict_banner = VerdictBanner()
        right_column = QWidget()
        right_layout = QVBoxLayout(right_column)
        right_layout.setContentsMargins(0, 0, 0, 0)
        right_layout.addWidget(self.verdict_banner)
        right_layout.addWidget(right, 1)
        run_tab = QSplitter()
        run_tab.addWidget(left)
        run_tab.addWidget(right_column)
        run_tab.setStretchFactor(1, 1)
        run_tab.setCollapsible(0, False)
        self.run_tab = run_tab
        self._run_right = right

        self.model_view = ModelView()
        self.history_view = HistoryView(self.history)
        self.history_view.open_requested.connect(self.show_record)
        self.history_view.compare_requested.connect(self.show_comparison)
        self.history_view.problem.connect(self._say_problem)
        self.tabs = QTabWidget()
        self.tabs.addTab(run_tab, "Run")
        self.tabs.addTab(self._holder("compare_view"), "Compare")
        self.tabs.addTab(self.model_view, "Model")
        self.tabs.addTab(self.history_view, "History")
        self.lab_worker = LabWorker(self)
        self.lab_worker.finished.connect(self._on_lab_finished)
        self.lab_worker.errored.connect(self._on_lab_errored)
        self.lab_worker.stopped.connect(self._on_lab_stopped)
        self.tabs.addTab(self._holder("numerics_view"), "Numerics")
        self.kernel_view = KernelView()
        self.tabs.addTab(self.kernel_view, "Kernels")
        self.fit_view = FitView(self.config_panel.form_values)
        self.tabs.addTab(self.fit_view, "Fit")
        self.plan_view = PlanView()
        self.tabs.addTab(self.plan_view, "Plan")
        self._stale_views: set[QWidget] = set()  # views not yet showing self.record
        self.tabs.currentChanged.connect(self._tab_changed)
        self.verdict_banner.details_requested.connect(
            lambda: self.tabs.setCurrentWidget(self.compare_view))
        self.record_shown.connect(self.verdict_banner.show_record)
        self.notice = NoticeBar()  # refusals and errors, whole, above the tabs
        central = QWidget()
        central_layout = QVBoxLayout(central)
        central_layout.setContentsMargins(0, 0, 0, 0)
        central_layout.setSpacing(2)
        central_layout.addWidget(self.notice)
        central_layout.addWidget(self.tabs, 1)
        self.setCentralWidget(central)

        self.run_progress = QProgressBar()
        self.run_progress.setMaximumWidth(110)
        self.run_progress.setFormat("run %p%")
        self.device_status = DeviceStatus()
        # permanent widgets: showMessage() would hide ordinary ones while it shows
        self.peak_status = PeakStatus()  # the measured matmul peak, and "Measure again"
        self.statusBar().addPermanentWidget(self.device_status)
        self.statusBar().addPermanentWidget(self.peak_status)
        self.statusBar().addPermanentWidget(self.run_progress)
        # the message is shown whole: the device line gives way to it
        self.statusBar().messageChanged.connect(self._fit_status)
        self.config_panel.device_changed.connect(self.peak_status.show_device)
        self.peak_status.busy_changed.connect(self._update_buttons)
        self.config_panel.engine_loaded.connect(self._freeze_startup_objects)
        self.config_panel.device_changed.connect(
            lambda info: self.device_status.show_device(info, self.config_panel.device_error))
        self.config_panel.validity_changed.connect(self._update_buttons)
        self.config_panel.device_changed.connect(self._on_device_changed)
        self.device_status.show_device(self.config_panel.device_info,
                                       self.config_panel.device_error)
        build_menus(self)

        self.config_panel.set_values(settings.load_config_dict())
        self._restore_geometry()
        self._update_buttons()
        if self.history.notice:
            self._say_problem(self.history.notice)
        outside = warning_line()  # a library outside the tested range: said once, then on
        if outside:
            self._say_problem(outside)

    # --- views built after the first paint (gui/deferred_views.py) ----------------------

    def _freeze_startup_objects(self, *_args) -> None:
        """Once torch, transformers and the views are loaded, leave their objects out of the
        garbage collector's scans: full collections over them stalled the window 150-450 ms."""
        gc.freeze()

    def _tab_changed(self, _index: int) -> None:
        widget = self.tabs.currentWidget()
        for name, holder in list(self._holders.items()):
            if holder is widget:
                widget = getattr(self, name)
        self._refresh_view(widget)

    # --- running -----------------------------------------------------------------------

    def _update_buttons(self, *_args) -> None:
        running = self.worker.is_running()
        # the lab's GPU work would skew a trial's timings: one at a time, either way round
        lab = self.lab_worker.is_running()
        peak = self.peak_status.is_busy()  # the matmul benchmark, likewise
        waiting = self.pending_run.waiting
        self.run_button.setEnabled(not running and not lab and not peak and not waiting
                                   and self.config_panel.error() is None)
        self.run_button.setToolTip("Waiting for the numerics lab to finish" if lab else
                                   "Waiting for the matmul peak benchmark to finish" if peak
                                   else "")
        self.peak_status.set_blocked(running or lab)
        self.stop_button.setEnabled(running or waiting)
        if not lab and "numerics_view" in self._built:  # a new one starts as it should
            self.numerics_view.set_busy(running)

    def _run_clicked(self) -> None:
        self.pending_run.click()

    def _say_problem(self, message: str) -> None:
        """A problem the user must know about: in the status bar, the notice bar and the
        log."""
        self.say(message, "warning")
        self.log_line("warning", message)

    def say(self, message: str, level: str | None = None) -> None:
        """``message`` in the status bar; one that matters (``level`` "error", "warning" or
        "info") also whole in the notice bar above the tabs."""
        self.statusBar().showMessage(message.splitlines()[0] if message else message)
        if level is not None:
            self.notice.show_message(message, level)

    def _fit_status(self, *_args) -> None:
        fit_device_line(self.statusBar(), self.device_status,
                        [self.peak_status, self.run_progress])

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._fit_status()

    def _on_device_changed(self, info) -> None:
        self._show_origin(None if self.worker.is_running() else self.record)
        if self.record is None:  # before any run, the charts this device will fill
            self.charts.set_device_kind(info.kind if info is not None else None)

    def _show_origin(self, record: RunRecord | None) -> None:
        """Name a run from another machine in the status bar and over the Run form."""
        here = local_device(self.config_panel.device_info)
        if record is None or not from_elsewhere(record, here):
            self.device_status.show_run(None)
            self.origin_banner.hide()
        else:
            # the status bar is one line: the precisions are in every tab
            self.device_status.show_run(run_summary(record, with_precisions=False))
            self.origin_banner.setText(
                f"Showing a report from {run_device(record)} (run {record.run_id}). The form "
                f"below is for a new run on this machine ({here or 'device not probed yet'}).")
            self.origin_banner.show()
        self._fit_status()

    def start_run(self, config: RunConfig | None = None) -> bool:
        """Start a run of ``config`` (the form's when None); False if it cannot start."""
        if self.worker.is_running() or self.lab_worker.is_running() or self.peak_status.is_busy():
            return False
        self.watch.stop()
        if config is None:
            try:
                config = self.config_panel.config()
            except ValueError as exc:
                message = self.config_panel.error() or str(exc)
                self.log_line("error", message)
                self.say(f"Run refused: {message}", "error")
                return False
            settings.save_config_dict(self.config_panel.saved_values())
        refusal = self._too_big(config)
        if refusal is not None:
            self.log_line("error", refusal)
            self.say(refusal, "error")
            return False
        self.record = RunRecord(config=config.to_dict())
        self._show_origin(None)
        self.notice.hide()
        self.charts.clear(config.warmup + config.steps)
        self.reset_live(list(config.precisions), trial_units(config.to_dict()))
        self._run_error = None
        self.log.clear()
        self.worker.start(config)
        self.start_progress()
        self._update_buttons()
        self.statusBar().showMessage("Starting the run…")
        self.setWindowTitle("AmpScope — new run")
        return True

    def _too_big(self, config: RunConfig, what: str = "Run") -> str | None:
        """Why ``config`` is refused for the memory it would need (engine.run.fits), or None;
        a prediction that cannot be made is logged and does not stop the run."""
        self.statusBar().showMessage("Checking that the run fits in the free memory…")
        QApplication.setOverrideCursor(Qt.CursorShape.WaitCursor)
        try:
            with ENGINE_IMPORTS:  # not beside the device probe's own imports
                from engine.run.fits import check

                fit = check(config)
        finally:
            QApplication.restoreOverrideCursor()
        if fit.note:
            self.log_line("info", fit.note)
        return None if fit.fits else f"{what} refused: {in_form_words(fit.refusal())}"

    def stop_run(self) -> None:
        if self.pending_run.cancel():
            return
        if self.worker.is_running():
            self.statusBar().showMessage("Stopping: the current step finishes first…")
            self.worker.stop()


    def keep_in_history(self, record: RunRecord) -> None:
        """Save a run; when the database refuses, say so and offer to export it instead."""
        try:
            self.history.add(record)
        except HistoryError as exc:
            message = (f"Run {record.run_id} was not saved to the history: {exc}. "
                       "Export it (File > Export run as) to keep it.")
            self._say_problem(message)
            answer = QMessageBox.question(
                self, "Run not saved", as_html(message + "\n\nExport it as a JSON report now?"))
            if answer == QMessageBox.StandardButton.Yes:
                self.open_export.ask_export_run("json")
            return
        self.history_view.refresh()

    def log_line(self, level: str, message: str, precision: str | None = None) -> None:
        where = f"[{precision}] " if precision else ""
        self.log.appendPlainText(f"{level.upper():7} {where}{message}")

    # --- showing records -----------------------------------------------------------------

    def show_results(self, record: RunRecord, only_shown: bool = False) -> None:
        """Rebuild the Compare and Model views (tens of ms each); during a run only the one
        on screen, the others when their tab is shown."""
        self._stale_views = {self.compare_view, self.model_view, self.kernel_view,
                             self.numerics_view}
        if not only_shown:
            self._refresh_view(self.compare_view)
            self._refresh_view(self.model_view)
            self._refresh_view(self.kernel_view)
            self._refresh_view(self.numerics_view)
        else:
            self._refresh_view(self.tabs.currentWidget())

    def _refresh_view(self, view) -> None:
        if view in self._stale_views and self.record is not None:
            self._stale_views.discard(view)
            view.show_record(self.record)

    def show_record(self, record: RunRecord, series=None) -> None:
        """Show a finished run (opened report, history entry) in every view; ``series``
        are its chart arrays when they were prepared off the GUI thread."""
        if self.worker.is_running():
            self.statusBar().showMessage("Stop the current run before opening another one.")
            return
        self.watch.stop()
        self.record = record
        config = record.config
        precisions = record_precisions(record)
        self.trial_table.reset(precisions, config.get("warmup", 0) + config.get("steps", 1))
        for p in precisions:
            steps = record.steps(p)
            if steps:  # the table shows a trial's newest step
                self.trial_table.add_step(steps[-1])
        for trial in record.trials:
            self.trial_table.finish_trial(trial)
        if series is None:
            self.charts.show_record(record, precisions)
        else:
            self.charts.show_series(record, series)
        self.log.clear()
        for entry in record.logs:
            self.log_line(entry.level, entry.message, entry.precision)
        self.show_results(record)
        if record.numerics:
            self.numerics_view.show_numerics(record.numerics)
        else:
            self.numerics_view.clear(f"Run {record.run_id} has no numerics: run the lab here.")
        self.setWindowTitle(f"AmpScope — run {record.run_id}")
        # no run is in progress: the bar says a saved report is on show, not "run 0%"
        self.run_progress.setRange(0, 1)  # a watched user's run left it busy
        self.run_progress.setValue(1)
        self.run_progress.setFormat("report")
        self.statusBar().showMessage(f"Showing run {record.run_id} ({record.status})")
        self._show_origin(record)
        self.record_shown.emit(record)

    def show_comparison(self, record: RunRecord, note: str) -> None:
        self._stale_views.discard(self.compare_view)
        self.compare_view.show_record(record, note)
        self.tabs.setCurrentWidget(self.compare_view)

    # --- files (gui/open_export.py, gui/watch_actions.py) -----------------------------

    def open_report(self, path: str | Path) -> bool:
        return self.open_export.open_report(path)

    def export_run(self, path: str | Path) -> bool:
        return self.open_export.export_run(path)

    def export_chart(self, key: str, path: str | Path) -> Path:
        return self.open_export.export_chart(key, path)

    def watch_run(self, path: str | Path) -> bool:
        return self.watch.watch_run(path)

    def chart_titles(self) -> dict[str, str]:
        titles = {f"live/{k}": f"Live: {title}" for k, (title, _, _) in LIVE_CHARTS.items()}
        titles.update({f"compare/{k}": f"Compare: {k.replace('_', ' ')}"
                       for k in COMPARE_CHARTS})
        titles["numerics/histogram"] = "Numerics: gradient histogram"
        return titles

    def chart(self, key: str):
        group, name = key.split("/", 1)
        if group == "numerics":
            return self.numerics_view.histogram
        return (self.charts.plots if group == "live" else self.compare_view.plots)[name]

    # --- window state --------------------------------------------------------------------

    def _default_size(self) -> None:
        """1400x900, or the screen's free area when that is smaller (1366x768 laptops)."""
        screen = self.screen().availableGeometry()
        self.resize(min(1400, screen.width()), min(900, screen.height()))

    def _restore_geometry(self) -> None:
        # a damaged or foreign value is ignored: the window opens at its default size
        geometry, state = settings.window_state()
        if geometry is None or not self.restoreGeometry(geometry):
            self._default_size()
        if state is not None:
            self.restoreState(state)

    def closeEvent(self, event) -> None:
        if event.spontaneous() and not may_quit(self):  # the window's close button
            event.ignore()
            return
        # a run in progress is stopped and its thread joined: nothing outlives the window
        self.watch.stop()
        if self.worker.is_running():
            # a cancel lets the trial end at its next step, keeping what it held; one still
            # loading its model would not see it for seconds: its process is ended then
            self.worker.stop()
            if not self.worker.join(CLOSE_GRACE_S):
                self.worker.abort()
                self.worker.join()
        self.lab_worker.stop()  # its process is ended
        self.lab_worker.join()
        self.fit_view.worker.stop()  # ends the running probe's process
        self.fit_view.worker.join()
        store = settings.open_settings()
        store.setValue("window/geometry", self.saveGeometry())
        store.setValue("window/state", self.saveState())
        settings.save_config_dict(self.config_panel.saved_values())
        super().closeEvent(event)
