"""Run pressed before the window's engine is ready: the button says it waits, the run starts
when it is.

On the CPU the form lets Run be pressed while the device probe is still importing torch (and,
after its answer, transformers). Starting then blocked the window on those imports for about
ten seconds with nothing on screen changing. Instead the click is held: the button reads
"Waiting for the device…" and is disabled, Stop cancels the wait, and the run starts as soon as
the probe has answered and the engine's imports are done.
"""

from __future__ import annotations

from PySide6.QtCore import QObject

from gui.worker import ENGINE_IMPORTS

RUN = "Run"
WAITING = "Waiting for the device…"
QUEUED = ("Run queued: it starts when the device probe has answered and the engine has "
          "loaded (Stop cancels)")


class PendingRun(QObject):
    def __init__(self, window) -> None:
        super().__init__(window)
        self._window = window
        self.waiting = False
        self._engine_loaded = False
        panel = window.config_panel
        panel.engine_loaded.connect(self._on_engine_loaded)
        panel.device_changed.connect(self._start_if_ready)

    def ready(self) -> bool:
        """Starting a run now would not wait on the probe's imports (a warm-up that failed
        holds them no longer: the run then says what is wrong)."""
        return not self._window.config_panel.device_pending() and (
            self._engine_loaded or not ENGINE_IMPORTS.locked())

    def click(self) -> None:
        """Run pressed: start now, or hold the run until the engine is ready."""
        if self.ready():
            self._window.start_run()
            return
        self.waiting = True
        self._show_waiting()
        self._window.statusBar().showMessage(QUEUED)

    def cancel(self) -> bool:
        """Stop pressed while waiting: the run is not started (True when there was one)."""
        if not self.waiting:
            return False
        self.waiting = False
        self._window.run_button.setText(RUN)
        self._window.statusBar().showMessage("Queued run cancelled")
        self._window._update_buttons()
        return True

    def _show_waiting(self) -> None:
        button = self._window.run_button
        button.setText(WAITING)
        button.setEnabled(False)
        self._window.stop_button.setEnabled(True)

    def _on_engine_loaded(self) -> None:
        self._engine_loaded = True
        self._start_if_ready()

    def _start_if_ready(self, *_args) -> None:
        if not self.waiting or not self.ready():
            return
        self.waiting = False
        self._window.run_button.setText(RUN)
        # a probe that failed leaves the form invalid: start_run says why, as a click would
        self._window.start_run()
