"""The History tab: past runs from the SQLite store; reopen, delete, compare across runs.

Each run is a row whose children are its trials; ticking trials (from any runs) and
pressing "Compare ticked trials" sends them to the Compare view as ``run-id/precision``.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMessageBox,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine.record.journal import journal_entries, journal_path, read_run
from engine.record.rank_journals import rank_journals, rank_of
from engine.record.run_record import RunRecord
from gui.history import (
    HistoryEntry,
    HistoryError,
    HistoryStore,
    combine_trials,
    comparison_note,
)
from gui.history_status import journal_trial_statuses, outcome
from gui.palette import precision_color
from gui.plain_text import as_html

EMPTY_TEXT = ("No runs yet. Every run you make on the Run tab is kept here when it ends; "
              "open one again, or tick trials from several runs to compare them.")
HEADERS = ("Run / trial", "Started", "Model", "Precisions", "Device", "Status")
ID_ROLE = Qt.ItemDataRole.UserRole


class HistoryView(QWidget):
    open_requested = Signal(object)  # RunRecord
    compare_requested = Signal(object, str)  # combined RunRecord, note
    problem = Signal(str)  # a run that cannot be listed, opened or deleted, and why

    def __init__(self, store: HistoryStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self.tree = QTreeWidget()
        self.tree.setHeaderLabels(HEADERS)
        self.tree.header().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.tree.itemDoubleClicked.connect(self._open_item)
        self.message = QLabel()
        self.message.setTextFormat(Qt.TextFormat.PlainText)
        self.message.setWordWrap(True)
        open_button = QPushButton("Open")
        open_button.clicked.connect(self._open_selected)
        delete_button = QPushButton("Delete")
        delete_button.clicked.connect(self._delete_selected)
        compare_button = QPushButton("Compare ticked trials")
        compare_button.clicked.connect(self.compare_checked)
        buttons = QHBoxLayout()
        for button in (open_button, delete_button, compare_button):
            buttons.addWidget(button)
        buttons.addWidget(self.message, 1)
        layout = QVBoxLayout(self)
        self.empty = QLabel(EMPTY_TEXT)
        self.empty.setWordWrap(True)
        layout.addWidget(QLabel("Tick trials from one or more runs to compare them side by side."))
        layout.addWidget(self.empty)
        layout.addWidget(self.tree)
        layout.addLayout(buttons)
        self.refresh()

    def _fail(self, message: str) -> None:
        self.message.setText(message)
        self.problem.emit(message)

    def refresh(self) -> None:
        self.tree.clear()
        try:
            entries = self.store.list()
        except HistoryError as exc:
            entries = []
            self._fail(str(exc))
        # runs the database does not hold (a window or CLI run that was killed, a CLI
        # run) are read from their journals in the data folder
        journaled = journal_entries({e.id for e in entries})
        # a torchrun run journals once per rank: one entry (any rank's file reads them all)
        journaled = list({j.run_id: j for j in reversed(journaled)}.values())[::-1]
        self._journals = {j.run_id: j.path for j in journaled}
        # a damaged journal is listed (never a reason not to start): the problem is its tip
        problems = {j.run_id: j.problem for j in journaled if j.problem}
        # a run that reached its end is "ok" even when its trials ran out of memory: the
        # trials say how it ended, as the CLI does
        entries += [HistoryEntry(j.run_id, j.started_s, j.model, j.precisions, j.device,
                                 outcome(j.status, journal_trial_statuses(j.path))
                                 if j.status in ("ok", "cancelled", "error") else j.status)
                    for j in journaled]
        self.empty.setVisible(not entries)
        for entry in sorted(entries, key=lambda e: e.started_s, reverse=True):
            started = datetime.datetime.fromtimestamp(entry.started_s).strftime("%Y-%m-%d %H:%M")
            run = QTreeWidgetItem([entry.id, started, entry.model, ", ".join(entry.precisions),
                                   entry.device, entry.status])
            run.setData(0, ID_ROLE, entry.id)
            if entry.id in problems:
                for column in range(len(HEADERS)):
                    run.setToolTip(column, problems[entry.id])
            for precision in entry.precisions:
                child = QTreeWidgetItem([precision])
                child.setData(0, ID_ROLE, precision)
                child.setForeground(0, precision_color(precision))
                child.setFlags(child.flags() | Qt.ItemFlag.ItemIsUserCheckable)
                child.setCheckState(0, Qt.CheckState.Unchecked)
                run.addChild(child)
            self.tree.addTopLevelItem(run)

    def run_ids(self) -> list[str]:
        return [self.tree.topLevelItem(i).data(0, ID_ROLE)
                for i in range(self.tree.topLevelItemCount())]

    def _run_item(self, run_id: str) -> QTreeWidgetItem:
        index = self.run_ids().index(run_id)
        return self.tree.topLevelItem(index)

    def set_checked(self, run_id: str, precision: str, checked: bool = True) -> None:
        run = self._run_item(run_id)
        for i in range(run.childCount()):
            if run.child(i).data(0, ID_ROLE) == precision:
                run.child(i).setCheckState(
                    0, Qt.CheckState.Checked if checked else Qt.CheckState.Unchecked)

    def checked(self) -> list[tuple[str, str]]:
        picks = []
        for run_id in self.run_ids():
            run = self._run_item(run_id)
            for i in range(run.childCount()):
                if run.child(i).checkState(0) == Qt.CheckState.Checked:
                    picks.append((run_id, run.child(i).data(0, ID_ROLE)))
        return picks

    # --- actions -----------------------------------------------------------------------

    def _load(self, run_id: str) -> RunRecord:
        if run_id in self._journals:
            return read_run(self._journals[run_id])
        return self.store.load(run_id)

    def open_run(self, run_id: str) -> RunRecord | None:
        try:
            record = self._load(run_id)
        except (KeyError, ValueError, HistoryError) as exc:
            self._fail(f"Cannot open {exc}" if isinstance(exc, ValueError)
                       else str(exc).strip("'"))
            return None
        self.message.setText("")
        self.open_requested.emit(record)
        return record

    def delete_run(self, run_id: str) -> None:
        # the journal goes too, or the run would be listed again from it at once
        own = journal_path(run_id) if Path(run_id).name == run_id else None  # no "../"
        paths = {self._journals.get(run_id), own} - {None}
        for path in list(paths):  # a torchrun run: every rank's journal
            if rank_of(path) is not None:
                paths.update(rank_journals(path))
        for path in paths:
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                self._fail(f"Cannot delete the journal {path}: {exc.strerror}")
        try:
            self.store.delete(run_id)
        except HistoryError as exc:
            self._fail(str(exc))
        self.refresh()

    def compare_checked(self) -> None:
        picks = self.checked()
        if not picks:
            self.message.setText("Tick at least one trial first.")
            return
        try:
            records = {run_id: self._load(run_id)
                       for run_id in dict.fromkeys(r for r, _ in picks)}
        except (KeyError, ValueError, HistoryError) as exc:
            self._fail(f"Cannot compare: {exc}")
            return
        chosen = [(records[r], p) for r, p in picks]
        self.message.setText("")
        self.compare_requested.emit(combine_trials(chosen), comparison_note(chosen))

    def _selected_run_id(self) -> str | None:
        item = self.tree.currentItem()
        if item is None:
            return None
        return (item.parent() or item).data(0, ID_ROLE)

    def _open_item(self, item: QTreeWidgetItem) -> None:
        self.open_run((item.parent() or item).data(0, ID_ROLE))

    def _open_selected(self) -> None:
        run_id = self._selected_run_id()
        if run_id is None:
            self.message.setText("Select a run to open.")
            return
        self.open_run(run_id)

    def _delete_selected(self) -> None:
        run_id = self._selected_run_id()
        if run_id is None:
            self.message.setText("Select a run to delete.")
            return
        answer = QMessageBox.question(self, "Delete run",
                                      as_html(f"Delete run {run_id} from the history?"))
        if answer == QMessageBox.StandardButton.Yes:
            self.delete_run(run_id)
