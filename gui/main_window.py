"""The AmpScope window: configure a run, watch it live, compare, inspect, export, revisit.

Every view is built from a ``RunRecord``: a live run folds the worker's events into one
with ``record.apply`` (charts and the trial table also take each event as it comes),
and an opened report or a history entry is the same kind of record, shown by the same
``show_record`` calls. The window measures and computes nothing itself: it builds the
views and wires them together. Its menus are built by ``gui.menus``; opening and exporting
reports is ``gui.open_export.OpenExport``'s, following another process's journal
``gui.watch_actions.WatchActions``'s.
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
from engine.core.events import (
    ErrorEvent,
    LogEvent,
    MonitorSample,
    PhaseChanged,
    RunFinished,
    RunStarted,
    ScalarLog,
    StepSample,
    TrialFinished,
    TrialStarted,
    to_dict,
)
from engine.core.versions import warning_line
from engine.record.compare import record_precisions
from engine.record.run_record import RunRecord
from gui import settings
from gui.chart_specs import COMPARE_CHARTS, LIVE_CHARTS, NAMED_TRIALS, device_kind
from gui.config_panel import ConfigPanel, in_form_words
from gui.device_status import DeviceStatus
from gui.fit_view import FitView
from gui.history import HistoryError, HistoryStore
from gui.history_view import HistoryView
from gui.kernel_view import KernelView
from gui.menus import build_menus
from gui.model_view import ModelView
from gui.notice_bar import NoticeBar, fit_device_line
from gui.open_export import OpenExport
from gui.peak_status import PeakStatus
from gui.pending_run import PendingRun
from gui.plain_text import as_html
from gui.plan_view import PlanView
from gui.quit_guard import may_quit
from gui.run_origin import from_elsewhere, local_device, run_device, run_summary
from gui.trial_table import TrialTable, trial_units
from gui.verdict_banner import VerdictBanner, gist
from gui.watch_actions import WatchActions
from gui.worker import ENGINE_IMPORTS, LabWorker, RunWorker

LOADING = "loading model…"


# what the trial table and status bar say in each engine phase (engine.core.events.PHASES)
PHASE_TEXT = {"loading": LOADING, "probes": "counting FLOPs (untimed)", "warm-up": "warm-up",
              "measuring": "measuring",
              "memory step": "memory step (untimed)", "profiled step": "profiled step (untimed)",
              "between rounds": "between rounds"}
_EXTRA_STEPS = ("memory step", "profiled step")  # untimed steps after the measured ones


CLOSE_GRACE_S = 3.0  # closing waits this long for a cancelled trial before ending it


class _Deferred:
    """A view that needs pyqtgraph (its import and plots take about a second): built after
    the window's first paint, or at once when something uses it before then."""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, window, owner=None):
        if window is None:
            return self
        return window._built.get(self.name) or window._build(self.name)


class MainWindow(QMainWindow):
    charts = _Deferred()  # the Run tab's live charts
    compare_view = _Deferred()
    numerics_view = _Deferred()
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

    # --- views built after the first paint ----------------------------------------------

    def _holder(self, name: str) -> QWidget:
        holder = QWidget()
        self._holders[name] = holder
        return holder

    def _build(self, name: str) -> QWidget:
        view = getattr(self, f"_make_{name}")()
        holder = self._holders.pop(name)
        if name == "charts":
            self._run_right.replaceWidget(0, view)
        else:  # a tab: the view takes the stand-in's place, the current tab stays
            index, current = self.tabs.indexOf(holder), self.tabs.currentIndex()
            blocked = self.tabs.blockSignals(True)  # the swap is not the user changing tab
            self.tabs.insertTab(index, view, self.tabs.tabText(index))
            self.tabs.removeTab(index + 1)
            self.tabs.setCurrentIndex(current)
            self.tabs.blockSignals(blocked)
        holder.deleteLater()
        self._built[name] = view
        return view

    def _make_charts(self) -> QWidget:
        from gui.live_charts import LiveCharts

        return LiveCharts()

    def _make_compare_view(self) -> QWidget:
        from gui.compare_view import CompareView

        return CompareView()

    def _make_numerics_view(self) -> QWidget:
        from gui.numerics_view import NumericsView

        view = NumericsView()
        view.run_requested.connect(self.start_lab)
        view.stop_requested.connect(self.stop_lab)
        view.show_inputs(self.config_panel.form_values())
        self.config_panel.changed.connect(
            lambda: view.show_inputs(self.config_panel.form_values()))
        view.set_busy(self.worker.is_running() or self.lab_worker.is_running())
        return view

    def paintEvent(self, event) -> None:
        super().paintEvent(event)
        if self._holders and not getattr(self, "_building", False):
            self._building = True
            QTimer.singleShot(0, self._build_next)

    def _build_next(self) -> None:
        """One deferred view per turn of the event loop, so input is handled between."""
        if self._holders:
            getattr(self, next(iter(self._holders)))
        if self._holders:
            QTimer.singleShot(0, self._build_next)
        else:
            self.config_panel.start_probe()
            self.ready.emit()

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

    def show_event(self, event) -> None:
        if self.record is None:
            return
        self.record.apply(event)
        if isinstance(event, StepSample):
            if event.precision not in self._phases and event.step == 0:
                # a run that journals no phases (a user's own loop): it trains, that is all
                self.trial_table.set_status(event.precision, "running")
                self.statusBar().showMessage(f"{event.precision}: training…")
            self.charts.add_step(event)
            # progress bars repaint at once on setValue: shown at the redraw rate instead
            self._latest_steps[event.precision] = event
        elif isinstance(event, MonitorSample):
            self.charts.add_monitor(event)
        elif isinstance(event, ScalarLog):
            self.charts.add_scalar(event)
        elif isinstance(event, RunStarted):
            self.charts.begin(event.time_s)
            self.charts.set_device_kind(device_kind(event.environment))
            self.charts.set_source(event.config.get("source"))
            self.setWindowTitle(f"AmpScope — run {event.run_id} (running)")
            self.log_line("info", f"run {event.run_id} started on "
                          f"{event.environment.get('device', {}).get('description', 'n/a')}")
        elif isinstance(event, TrialStarted):
            self._rounds = event.rounds
            if event.rounds > 1:  # interleaved: every round warms up again
                config = self.record.config
                per = trial_units(config, event.rounds)
                self.run_progress.setRange(0, per * len(config.get("precisions", [])))
                self.trial_table.set_steps_per_trial(per)
            self._show_phase(event.precision, "loading", event.round, said=False)
            self.charts.mark_trial_start(
                event.precision, event.time_s, event.round == 0 and len(
                    self.record.config.get("precisions", [])) <= NAMED_TRIALS)
        elif isinstance(event, PhaseChanged):
            self._show_phase(event.precision, event.phase, event.round)
        elif isinstance(event, TrialFinished):
            self.show_progress()
            trial = event.result
            self.trial_table.finish_trial(trial)
            self.statusBar().showMessage(f"{trial.precision}: {trial.status}")
            self.charts.note_trial(trial)
            if trial.status != "ok":
                self.log_line("warning", f"{trial.status}: {trial.reason or ''}", trial.precision)
            self.show_results(self.record, only_shown=True)
        elif isinstance(event, LogEvent):
            self.log_line(event.level, event.message, event.precision)
        elif isinstance(event, ErrorEvent):
            self.log_line("error", event.message, event.precision)
            self._run_error = event.message
            if event.precision:
                self.trial_table.set_status(event.precision, "error", event.message)
        elif isinstance(event, RunFinished):
            outcome = self._outcome(self.record)
            if self.watch.watching:  # another process's run, not the user's own
                outcome = f"Watched run {self.record.run_id}: " + outcome.removeprefix(
                    "Run ").replace("cancelled", "stopped by its own process", 1)
            failed = any(t.status not in ("ok", "cancelled") for t in self.record.trials)
            self.say(outcome, "warning" if failed or self.record.status == "error" else None)
            self.setWindowTitle(f"AmpScope — run {self.record.run_id}")

    def _show_phase(self, precision: str, phase: str, round_: int, said: bool = True) -> None:
        """The phase in the trial's row and the status bar, with the round when there are
        several; ``said``: the engine said it (a TrialStarted only implies loading)."""
        if said:
            self._phases.setdefault(precision, []).append(phase)
        text = PHASE_TEXT.get(phase, phase)
        if self._rounds > 1:
            text += f" (round {round_ + 1}/{self._rounds})"
        self.trial_table.set_status(precision, text)
        self.statusBar().showMessage(f"{precision}: {text}")

    def _outcome(self, record: RunRecord) -> str:
        """How the run ended, in words; the progress bar says it too."""
        if self.run_progress.maximum() == 0:  # no known length (a user's loop): its steps
            steps = sum(len(record.steps(p)) for p in record_precisions(record))
            self.run_progress.setRange(0, 1)  # the busy bar stops
            self.run_progress.setValue(1)
            where, done_text = f"after {steps} steps", f"done: {steps} steps"
        else:
            done = self.run_progress.value() * 100 // max(1, self.run_progress.maximum())
            where, done_text = f"at {done}%", "done"
        failed = [t for t in record.trials if t.status not in ("ok", "cancelled")]
        if record.status == "cancelled":
            self.run_progress.setFormat(f"cancelled {where}")
            return f"Run cancelled {where}: the steps measured so far are kept"
        if record.status == "error" and not record.trials:
            self.run_progress.setFormat("failed")
            return "Run failed: see the log"
        total = len(record.config.get("precisions", [])) or len(record.trials)
        if failed:
            self.run_progress.setFormat(f"{len(failed)} of {total} failed")
            return f"Run finished: {len(failed)} of {total} trials failed (see Trials)"
        self.run_progress.setFormat(done_text)
        return f"Run finished: all {total} trials ok"

    def show_progress(self) -> None:
        """Steps seen, a finished precision counting in full (interleaved rounds alternate);
        a stopped one counts the steps it ran, so Stop reads "cancelled at 44%", not 100%.
        Called at the redraw rate, with the newest step of each trial for the table."""
        for step in self._latest_steps.values():
            self.trial_table.add_step(step)
        if self.record is not None and self.run_progress.maximum() == 0:
            # a user's loop has no known length: the bar is busy, the count is said here
            for step in self._latest_steps.values():
                count = len(self.record.steps(step.precision))
                self.statusBar().showMessage(f"{step.precision}: training… {count} steps "
                                             "so far")
            self._latest_steps.clear()
            return
        self._latest_steps.clear()
        if self.record is None:
            return
        precisions = self.record.config.get("precisions", [])
        per = self.run_progress.maximum() // max(1, len(precisions))

        def done(precision: str) -> int:
            trial = self.record.trial(precision)
            if trial is not None and trial.status != "cancelled":
                return per
            log = self._phases.get(precision, [])
            # an untimed step counts once the phase after it began
            extras = sum(1 for phase in log[:-1] if phase in _EXTRA_STEPS)
            return min(per, len(self.record.steps(precision)) + extras)

        for p in precisions:
            if p in self.trial_table.precisions():
                self.trial_table.set_progress(p, done(p))
        self.run_progress.setValue(sum(done(p) for p in precisions))

    def _on_errored(self, message: str) -> None:
        if message != self._run_error:  # the engine may have said it already as an ErrorEvent
            self.log_line("error", message)
        self._run_error = message
        self.run_progress.setFormat("failed")
        self.say(f"Run failed: {message}", "error")

    def _on_finished(self, _runner_record) -> None:
        # the window's own record was folded from the same events as the runner's
        record = self.record
        if record is not None and record.finished_s is None:
            record.status = "error"  # the run raised before it could finish
            why = (self._run_error or "the run failed: see the log").splitlines()[0]
            for p in self.trial_table.precisions():
                if record.trial(p) is None:
                    self.trial_table.set_status(p, "not run", why)
        self.worker.join()
        self._progress_timer.stop()
        self.show_progress()
        self._update_buttons()
        if record is None:
            return
        self.charts.finish()
        self.show_results(record)
        if record.run_id:
            self.setWindowTitle(f"AmpScope — run {record.run_id}")
            self.keep_in_history(record)
        self.record_shown.emit(record)  # the verdict banner shows the run's verdict
        said = self.statusBar().currentMessage()
        verdict = f"Verdict: {gist(self.verdict_banner.headline.text())}"
        self.statusBar().showMessage(f"{said}. {verdict}" if said else verdict)

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

    # --- numerics lab --------------------------------------------------------------------

    def start_lab(self, precision: str) -> bool:
        """Run the numerics lab with the Run tab's model, device, batch and sequence length."""
        if self.lab_worker.is_running() or self.worker.is_running() or self.peak_status.is_busy():
            return False
        values = self.config_panel.form_values()
        from gui.numerics_view import lab_inputs

        try:  # the lab trains one step of the Run tab's model: it must fit, like a run
            config = RunConfig(model=values["model"], precisions=(precision,),
                               batch_size=values["batch_size"], seq_len=values["seq_len"],
                               device=values["device"],
                               trust_remote_code=values["trust_remote_code"])
            refusal = self._too_big(config, "Numerics lab")
        except ValueError as exc:
            refusal = f"Numerics lab refused: {self.config_panel.error() or exc}"
        if refusal is not None:
            self.numerics_view.set_busy(False, refusal)
            self.log_line("error", refusal)
            self.say(refusal, "error")
            return False
        trials = None
        if self.record is not None and not self.worker.is_running():
            trials = [to_dict(t) for t in self.record.trials]  # the advice cites them
        self.numerics_view.set_busy(True)
        self.numerics_view.lab_started(
            f"Running the numerics lab for {precision} ({lab_inputs(values)})…")
        self.lab_worker.start(
            model=values["model"], precision=precision, device=values["device"],
            batch_size=values["batch_size"], seq_len=values["seq_len"], trials=trials,
            loss_scale=values["init_scale"], trust_remote_code=values["trust_remote_code"])
        self._update_buttons()
        return True

    def stop_lab(self) -> None:
        if self.lab_worker.is_running():
            self.numerics_view.stop_button.setEnabled(False)
            self.lab_worker.stop()

    def _on_lab_stopped(self) -> None:
        self.lab_worker.join()
        self.numerics_view.set_busy(False)
        self.numerics_view.lab_ended("Numerics lab stopped: its process was ended, nothing "
                                     "was measured.")
        self._update_buttons()

    def _on_lab_finished(self, numerics: dict) -> None:
        self.lab_worker.join()
        self.numerics_view.lab_ended()
        self.numerics_view.set_busy(False)
        self._update_buttons()
        self.numerics_view.show_numerics(numerics)
        record = self.record
        if record is not None and not self.worker.is_running() and record.run_id:
            # the run's report and history entry carry the lab from now on
            record.numerics = numerics
            self.keep_in_history(record)
            from engine.record.journal import append_numerics, journal_path

            if journal_path(record.run_id).is_file():
                append_numerics(journal_path(record.run_id), numerics)

    def _on_lab_errored(self, message: str) -> None:
        self.lab_worker.join()
        self.numerics_view.lab_ended()
        self.numerics_view.set_busy(False, f"Numerics lab failed: {message.splitlines()[0]}")
        self._update_buttons()
        self.log_line("error", f"numerics lab: {message}")
        self.say(f"Numerics lab failed: {message}", "error")

    def log_line(self, level: str, message: str, precision: str | None = None) -> None:
        where = f"[{precision}] " if precision else ""
        self.log.appendPlainText(f"{level.upper():7} {where}{message}")

    # --- live views, shared by a run started here and a watched one ---------------------

    def reset_live(self, precisions: list[str], units: int) -> None:
        """Empty trial rows of ``units`` progress units each, and the run's progress at 0."""
        self.trial_table.reset(list(precisions), units)
        self.verdict_banner.hide()  # the last run's: this one has none yet
        self.run_progress.setRange(0, units * len(precisions))
        self.run_progress.setValue(0)
        self.run_progress.setFormat("run %p%")  # a report on show said "report"
        self._latest_steps.clear()
        self._phases.clear()
        self._rounds = 1

    def start_progress(self) -> None:
        """The trial table and progress bar follow the steps at the redraw rate."""
        self._latest_steps.clear()
        self._progress_timer.start()

    def stop_progress(self) -> None:
        self._progress_timer.stop()

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
