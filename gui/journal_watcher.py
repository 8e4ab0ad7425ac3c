"""File > Watch run: follows a run journal in a thread and re-emits its events as signals.

Like ``RunWorker`` for a run the window started: a Python thread polls an
``engine.record.follow.JournalFollower`` (a few reads a second, each reading only what was
added) and emits each event; Qt queues the signals to the GUI thread, which folds them
into the same views as a live run. The GUI thread never reads the file.
"""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Signal

POLL_S = 0.2


class JournalWatcher(QObject):
    # (watch number, engine event) in journal order; the number tells a new watch's events
    # from those of a stopped one still queued to the GUI thread
    event = Signal(int, object)
    errored = Signal(str)  # the file stopped being a readable journal
    finished = Signal(int)  # (watch number) the run ended: its RunFinished came

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.path = None
        self.generation = 0

    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, path) -> None:
        """Follow ``path``; raises ``ValueError`` (with the fix) for a missing file or a
        folder. What the file holds is read in the thread: a file that turns out not to
        be a journal is reported through ``errored``."""
        from engine.record.follow import JournalFollower

        self.stop()
        follower = JournalFollower(path)
        self.path = follower.path
        self.generation += 1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run,
                                        args=(follower, self._stop, self.generation),
                                        name="ampscope-watch", daemon=True)
        self._thread.start()

    def _run(self, follower, stop: threading.Event, generation: int) -> None:
        try:
            while True:
                for event in follower.poll():
                    if stop.is_set():
                        return
                    self.event.emit(generation, event)
                if follower.finished or stop.wait(POLL_S):
                    return
                if follower.abandoned():
                    raise ValueError(f"{follower.path}: the process that wrote it (pid "
                                     f"{follower.writer_pid}) is gone without ending the "
                                     "run: it was interrupted")
        except Exception as exc:  # noqa: BLE001 (a watch that stops must say why, never hang)
            if not stop.is_set():
                self.errored.emit(str(exc) if isinstance(exc, ValueError)
                                  else f"{follower.path}: {type(exc).__name__}: {exc}")
        finally:
            if not stop.is_set():
                self.finished.emit(generation)

    def stop(self) -> None:
        """Stop following (the run itself goes on); waits for the thread."""
        self._stop.set()
        self.generation += 1
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._thread = None
