"""A run's events as the window shows them, for a run started here and one watched in
another process alike: the trial table's rows and progress, the status bar, the progress
bar, the live charts and the log, then how the run ended.

Events fold into the window's ``RunRecord`` as they come; the table and progress bar
follow the steps at the redraw rate (a progress bar repaints at once on ``setValue``).
"""

from __future__ import annotations

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
)
from engine.record.compare import record_precisions
from engine.record.run_record import RunRecord
from gui.chart_specs import NAMED_TRIALS, device_kind
from gui.trial_table import trial_units
from gui.verdict_banner import gist

LOADING = "loading model…"
# what the trial table and status bar say in each engine phase (engine.core.events.PHASES)
PHASE_TEXT = {"loading": LOADING, "probes": "counting FLOPs (untimed)", "warm-up": "warm-up",
              "measuring": "measuring",
              "memory step": "memory step (untimed)", "profiled step": "profiled step (untimed)",
              "between rounds": "between rounds"}
_EXTRA_STEPS = ("memory step", "profiled step")  # untimed steps after the measured ones


class RunEvents:
    """The live views' side of a MainWindow (a mixin: the window's constructor makes the
    widgets and ``_latest_steps``, ``_phases``, ``_rounds`` it reads)."""

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
