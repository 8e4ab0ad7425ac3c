"""File > Open and File > Export: reading a report or journal and writing the run on show,
both off the GUI thread, and the dialogs that ask for their paths (in the documents folder).

The window creates one ``OpenExport`` and keeps its views; this object only moves records
between files and the window's ``show_record``, and says how it went in the status bar,
the log and the window's ``record_shown`` / ``open_failed`` / ``exported`` /
``export_failed`` signals.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QFileDialog

from gui.worker import ReportLoader, ReportWriter

REPORT_FILTERS = {"html": "HTML report (*.html)", "json": "JSON report (*.json)",
                  "csv": "CSV table (*.csv)"}
OPEN_FILTER = "JSON report or run journal (*.json *.jsonl)"


def documents_dir() -> str:
    """Where file dialogs open: the user's documents folder, never the working folder. Made
    when missing: given a folder that does not exist, Qt's dialog opens the working folder
    and pre-fills the folder's name ("Documents") as the file name. The home folder where
    it cannot be made."""
    import platformdirs

    folder = Path(platformdirs.user_documents_dir())
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return str(Path.home())
    return str(folder)


class OpenExport(QObject):
    def __init__(self, window) -> None:
        super().__init__(window)
        self.window = window
        self.loader = ReportLoader(self)
        self.loader.progress.connect(self._on_open_progress)
        self.loader.loaded.connect(self._on_loaded)
        self.loader.failed.connect(self._on_open_failed)
        self.writer = ReportWriter(self)  # exports off the GUI thread
        self.writer.written.connect(self._on_exported)
        self.writer.failed.connect(self._on_export_failed)

    def _say(self, message: str) -> None:
        self.window.statusBar().showMessage(message)

    # --- open ----------------------------------------------------------------------------

    def open_report(self, path: str | Path) -> bool:
        """Start opening a JSON report or a run journal (.jsonl): it is read off the GUI
        thread, with progress in the status bar; ``record_shown`` or ``open_failed``
        follows. False if it cannot start now."""
        from engine.record.journal import read_run

        if self.loader.is_running() or self.window.worker.is_running():
            self._say("Wait for the current run or report to finish first.")
            return False
        self.window.run_progress.setRange(0, 100)
        self.window.run_progress.setFormat("opening %p%")
        self._say(f"Opening {path}…")
        self.loader.start(path, read_run)
        return True

    def _on_open_progress(self, stage: str, percent: int) -> None:
        self.window.run_progress.setValue(percent)
        self._say(f"Opening report: {stage}…")

    def _on_loaded(self, path, record, series) -> None:
        self.loader.join()
        self.window.run_progress.setFormat("run %p%")
        self.window.show_record(record, series)

    def _on_open_failed(self, path, message: str) -> None:
        self.loader.join()
        self.window.run_progress.setFormat("run %p%")
        # the previous run stays on show; the message names the file and the fault
        self.window.log_line("error", f"could not open the report: {message}")
        self.window.say(f"Could not open the report: {message}", "error")
        self.window.open_failed.emit(message)

    def ask_open_report(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.window, "Open report", documents_dir(),
                                              OPEN_FILTER)
        if path:
            self.open_report(path)

    # --- export --------------------------------------------------------------------------

    def export_run(self, path: str | Path) -> bool:
        """Start writing the run on show to ``path`` off the GUI thread; ``exported`` or
        ``export_failed`` follows. False if it cannot start now."""
        if self.window.record is None:
            self._say("Nothing to export yet: run or open a report first.")
            return False
        if self.writer.is_running():
            self._say("Wait for the report being written to finish first.")
            return False
        self._say(f"Writing the report to {path}…")
        self.writer.start(self.window.record, path)
        return True

    def _on_exported(self, written) -> None:
        self.writer.join()
        self._say(f"Report written to {written}")
        self.window.exported.emit(written)

    def _on_export_failed(self, path, message: str) -> None:
        self.writer.join()
        self.window.log_line("error", f"could not export to {path}: {message}")
        self.window.say(f"Export failed: {message}", "error")
        self.window.export_failed.emit(message)

    def export_chart(self, key: str, path: str | Path) -> Path:
        """Write one of the window's charts as PNG or SVG (by the file's extension)."""
        from gui.chart_export import export_chart  # pyqtgraph's exporters: not at start-up

        return export_chart(self.window.chart(key), path)

    def ask_export_run(self, kind: str) -> None:
        record = self.window.record
        name = f"ampscope-{record.run_id if record else 'run'}.{kind}"
        path, _ = QFileDialog.getSaveFileName(self.window, "Export run",
                                              str(Path(documents_dir(), name)),
                                              REPORT_FILTERS[kind])
        if path:
            if not path.lower().endswith(f".{kind}"):
                path += f".{kind}"
            self.export_run(path)

    def ask_export_chart(self, key: str) -> None:
        name = key.replace("/", "-") + ".png"
        path, _ = QFileDialog.getSaveFileName(self.window, "Export chart",
                                              str(Path(documents_dir(), name)),
                                              "PNG image (*.png);;SVG image (*.svg)")
        if path:
            try:
                self.export_chart(key, path)
            except (OSError, ValueError) as exc:
                self._say(f"Chart export failed: {exc}")
