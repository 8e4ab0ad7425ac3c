"""File > Watch run: follow a run journal another process writes (a user's own loop
recorded with the ``ampscope`` module, or any AmpScope run), in the window's live views.

A ``JournalWatcher`` reads the journal off the GUI thread; this object turns what it reads
into the same window calls a run started here makes (``show_event``, ``reset_live``,
``show_results``), so a watched run looks like one of the user's own.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QFileDialog

from engine.core.events import RunStarted
from engine.record.run_record import RunRecord
from gui.journal_watcher import JournalWatcher
from gui.trial_table import trial_units


class WatchActions(QObject):
    def __init__(self, window) -> None:
        super().__init__(window)
        self.window = window
        self.watching = False  # the run on show is another process's
        self.watcher = JournalWatcher(self)
        self.watcher.event.connect(self._on_event)
        self.watcher.errored.connect(self._on_errored)
        self.watcher.finished.connect(self._on_finished)

    def stop(self) -> None:
        """Stop following (another run is about to be shown)."""
        self.watcher.stop()
        self.watching = False

    def watch_run(self, path: str | Path) -> bool:
        """Follow a run journal as it grows, with the live views of a run started here."""
        window = self.window
        if window.worker.is_running():
            window.statusBar().showMessage("Stop the current run before watching another one.")
            return False
        try:
            self.watcher.start(path)
        except ValueError as exc:
            window.log_line("error", f"could not watch {path}: {exc}")
            window.statusBar().showMessage(f"Could not watch {path}: {exc}")
            return False
        window.record = RunRecord()
        self.watching = True
        window.charts.clear()
        window.trial_table.reset([], 1)
        window.log.clear()
        window.start_progress()  # the trial table follows at the redraw rate
        window.tabs.setCurrentIndex(0)
        window.statusBar().showMessage(f"Watching {self.watcher.path}…")
        return True

    def ask_watch_run(self) -> None:
        from engine.record.journal import runs_dir

        path, _ = QFileDialog.getOpenFileName(self.window, "Watch run", str(runs_dir()),
                                              "Run journals (*.jsonl);;All files (*)")
        if path:
            self.watch_run(path)

    def _on_event(self, generation: int, event) -> None:
        window = self.window
        if window.record is None or generation != self.watcher.generation:
            return  # queued by a watch that has been stopped since
        if isinstance(event, RunStarted):
            config = event.config
            own_run = config.get("source", "profile") == "profile"
            if own_run:  # the form shows the watched run's settings, as for a run started here
                window.config_panel.set_values(config)
            window.statusBar().showMessage(
                f"Watching run {event.run_id}: {config.get('model', 'n/a')}, "
                f"{', '.join(config.get('precisions', []))}")
            # a user's own loop has no untimed steps and no planned step count: 0, and the
            # bars show busy instead of a share of an unknown total
            steps = (trial_units(config) if own_run
                     else config.get("warmup", 0) + config.get("steps", 0))
            window.reset_live(list(config.get("precisions", [])), steps)
            window.setWindowTitle(f"AmpScope — watching run {event.run_id}")
        window.show_event(event)

    def _on_errored(self, message: str) -> None:
        window = self.window
        window.stop_progress()
        if window.run_progress.maximum() == 0:  # the busy bar stops
            window.run_progress.setRange(0, 1)
            window.run_progress.setFormat("stopped watching")
        if window.record is not None and window.record.run_id:
            window.setWindowTitle(f"AmpScope — run {window.record.run_id} (interrupted)")
        window.log_line("error", f"stopped watching: {message}")
        window.statusBar().showMessage(f"Stopped watching: {message}")

    def _on_finished(self, generation: int) -> None:
        window = self.window
        record = window.record
        if record is None or not record.run_id or generation != self.watcher.generation:
            return
        window.stop_progress()
        window.show_progress()
        window.charts.finish()
        window.show_results(record)
        if record.finished_s is not None:
            window.keep_in_history(record)
        window.record_shown.emit(record)
