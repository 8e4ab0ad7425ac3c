"""The one bridge between the engine and the window.

``RunWorker`` runs ``engine.run.runner.Runner`` in a Python thread and re-emits every
engine event as a Qt signal; ``LabWorker`` runs the numerics lab in a child process
and waits for it in a thread;
``DeviceProbe`` asks ``engine.measure.device.probe`` off the GUI thread (it imports torch and
initialises CUDA and NVML, seconds on a multi-GPU server). The
worker objects live in the GUI thread, so the signals they emit from their threads are
queued to the widgets' thread by Qt. They never touch a widget, and widgets never call
torch: they only see events and results.
"""

from __future__ import annotations

import queue
import threading
import traceback

from PySide6.QtCore import QObject, Signal

from engine.core.config import RunConfig
from gui.exit_guard import quiet_at_exit

# Held while a thread imports the engine (torch, transformers): two threads importing the
# same modules at once can each be handed the other's half-built module (Python breaks the
# import deadlock that way), which once killed the probe's thread ('prims' has no 'sum').
ENGINE_IMPORTS = threading.Lock()


class RunWorker(QObject):
    started = Signal()
    event = Signal(object)  # any engine event dataclass
    errored = Signal(str)  # the run itself failed (an exception escaped the engine)
    finished = Signal(object)  # the RunRecord, or None when the run raised

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._thread: threading.Thread | None = None
        self._runner = None
        self._lock = threading.Lock()

    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, config: RunConfig) -> None:
        if self.is_running():
            raise RuntimeError("a run is already in progress: stop it before starting another")
        # imported here so the window opens before torch and transformers have loaded
        with ENGINE_IMPORTS:
            from engine.run.runner import Runner

        with self._lock:
            self._runner = Runner(config, self.event.emit)
        self._thread = threading.Thread(target=self._run, name="ampscope-run", daemon=True)
        self.started.emit()
        self._thread.start()

    def _run(self) -> None:
        record = None
        try:
            record = self._runner.run()
        except ValueError as exc:  # bad input found before the run began: the fix is the message
            self.errored.emit(str(exc))
        except Exception as exc:  # reported in the log pane; the window stays up
            self.errored.emit(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        finally:
            with self._lock:
                self._runner = None
            self.finished.emit(record)

    def stop(self) -> None:
        """Ask the run to cancel; what was measured so far is kept."""
        with self._lock:
            if self._runner is not None:
                self._runner.cancel()

    def abort(self) -> None:
        """Stop now, for closing the window: the running trial's process is ended (one still
        loading its model would see the cancel only seconds later); what it sent is kept."""
        with self._lock:
            if self._runner is not None:
                self._runner.abort()

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait for the run thread; True when no thread is left running."""
        if self._thread is not None:
            self._thread.join(timeout_s)
        return not self.is_running()


class LabWorker(QObject):
    """Runs ``engine.numerics.lab.run_lab`` in a child process, as a trial runs: it
    initialises CUDA, and a sticky CUDA error there must not poison the window's
    process. A thread waits for the child; its dict comes back as a signal."""

    finished = Signal(object)  # the lab dict
    errored = Signal(str)
    stopped = Signal()  # ended on request (Stop) before it answered

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, **lab_args) -> None:
        if self.is_running():
            raise RuntimeError("the numerics lab is already running")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(lab_args,),
                                        name="ampscope-lab", daemon=True)
        self._thread.start()

    def _run(self, lab_args: dict) -> None:
        from engine.run.runner import run_lab_in_child

        try:
            result = run_lab_in_child(lab_args, self._stop.is_set)
        except (ValueError, RuntimeError) as exc:  # shown in the view; the window stays up
            self.errored.emit(str(exc))
            return
        if result is not None:
            self.finished.emit(result)
        else:  # stopped: by Stop, or the window closing (which no longer listens)
            self.stopped.emit()

    def stop(self) -> None:
        """End the lab's process now (closing the window)."""
        self._stop.set()

    def join(self, timeout_s: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout_s)
        return not self.is_running()


class DeviceProbe(QObject):
    """Answers ``probe(device)`` requests one at a time in a thread; the newest one wins."""

    answered = Signal(str, object, object)  # requested device, DeviceInfo | None, error | None
    # transformers is loaded too, after the first answer: a run checks its model with it
    # before starting, and importing it then (seconds, holding the GIL) stalled the window
    engine_loaded = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._requests: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def request(self, device: str) -> None:
        """Queue a question; it is answered once ``start`` has been called."""
        self._requests.put(device)

    def start(self) -> None:
        """Start answering (idempotent). Importing torch holds the GIL for long stretches,
        so the window calls this once it has painted, not while it builds its widgets."""
        if self._thread is None:
            self._thread = threading.Thread(target=quiet_at_exit(self._serve),
                                            name="ampscope-device-probe", daemon=True)
            self._thread.start()

    def _serve(self) -> None:
        with ENGINE_IMPORTS:
            from engine.measure.device import (
                probe,  # torch loads here, not on the window's start-up path
            )

        warmed = False
        while True:
            device = self._requests.get()
            while not self._requests.empty():  # a newer choice makes older ones moot
                device = self._requests.get()
            if not _tell(self.answered, device, *_answer(probe, device)):
                return
            if not warmed and self._requests.empty():
                with ENGINE_IMPORTS:
                    import engine.models.model_health  # noqa: F401 (the run's model check)
                    import engine.run.runner  # noqa: F401
                    from engine.models.hf import load_transformers

                    load_transformers()
                warmed = True
                if not _tell(self.engine_loaded):
                    return


def _answer(probe, device: str) -> tuple:
    """(DeviceInfo, None) or (None, why it cannot be used)."""
    try:
        return probe(device), None
    except ValueError as exc:  # e.g. cuda asked for on a machine without it
        return None, str(exc)
    except Exception as exc:  # a broken driver must not take the window down
        return None, f"device probe failed: {type(exc).__name__}: {exc}"


def _tell(signal, *args) -> bool:
    """Emit from a worker thread; False once the window that listened is gone."""
    try:
        signal.emit(*args)
    except RuntimeError:  # "Signal source has been deleted": the window was closed
        return False
    return True


class ReportLoader(QObject):
    """Reads a report and prepares its chart arrays in a thread: a 50 MB report takes
    seconds to parse, and the window must keep answering meanwhile."""

    progress = Signal(str, int)  # what it is doing, percent done
    loaded = Signal(object, object, object)  # path, RunRecord, chart series (record_series)
    failed = Signal(object, str)  # path, why (names the file and the fix)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._thread: threading.Thread | None = None

    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, path, read) -> None:
        """Read ``path`` with ``read(path) -> RunRecord`` (the engine's reader)."""
        if self.is_running():
            raise RuntimeError("a report is already being opened")
        self._thread = threading.Thread(target=quiet_at_exit(self._run), args=(path, read),
                                        name="ampscope-open-report", daemon=True)
        self._thread.start()

    def _run(self, path, read) -> None:
        from engine.record.compare import record_precisions
        from gui.live_charts import record_series

        self.progress.emit("reading", 0)
        try:
            record = read(path)
            self.progress.emit("preparing charts", 60)
            series = record_series(record, record_precisions(record))
        except (OSError, ValueError) as exc:
            self.failed.emit(path, str(exc))
            return
        except Exception as exc:  # a damaged report must not take the window down
            self.failed.emit(path, f"{type(exc).__name__}: {exc}")
            return
        self.progress.emit("showing", 100)
        self.loaded.emit(path, record, series)

    def join(self, timeout_s: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout_s)
        return not self.is_running()


class ReportWriter(QObject):
    """Writes a report in a thread: an HTML report with its charts takes seconds, and the
    window must keep answering meanwhile."""

    written = Signal(object)  # the path written
    failed = Signal(object, str)  # path, why

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._thread: threading.Thread | None = None

    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, record, path) -> None:
        if self.is_running():
            raise RuntimeError("a report is already being written")
        self._thread = threading.Thread(target=self._run, args=(record, path),
                                        name="ampscope-export", daemon=True)
        self._thread.start()

    def _run(self, record, path) -> None:
        from engine.report.writer import write_report

        try:
            written = write_report(record, path)
        except (OSError, ValueError) as exc:
            self.failed.emit(path, str(exc))
            return
        except Exception as exc:  # a report that cannot be made must not take the window down
            self.failed.emit(path, f"{type(exc).__name__}: {exc}")
            return
        self.written.emit(written)

    def join(self, timeout_s: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout_s)
        return not self.is_running()


class PeakBenchmark(QObject):
    """Measures the device's matmul peak again (``engine.measure.matmul_peak``) in a thread: a
    second or two of matmuls per dtype, which the window must not wait for. The new
    figure replaces the cached one, so the runs that follow divide by it."""

    progress = Signal(str, int, int)  # the dtype being timed, its number (from 1), how many
    measured = Signal(object, object)  # the DeviceInfo, its MeasuredPeak
    failed = Signal(str)  # why

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._thread: threading.Thread | None = None

    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, info) -> None:
        if self.is_running():
            raise RuntimeError("the matmul peak is already being measured")
        self._thread = threading.Thread(target=self._run, args=(info,),
                                        name="ampscope-matmul-peak", daemon=True)
        self._thread.start()

    def _run(self, info) -> None:
        from engine.measure import matmul_peak

        dtypes = matmul_peak.DTYPES

        def on_dtype(dtype: str) -> None:
            _tell(self.progress, dtype, dtypes.index(dtype) + 1, len(dtypes))

        try:
            result = matmul_peak.for_device(info, rerun=True, on_dtype=on_dtype)
        except Exception as exc:  # an unwritable cache folder, a broken driver: said, not fatal
            _tell(self.failed, f"{type(exc).__name__}: {exc}")
            return
        _tell(self.measured, info, result)

    def join(self, timeout_s: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout_s)
        return not self.is_running()
