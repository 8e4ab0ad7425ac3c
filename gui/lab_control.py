"""The numerics lab run from the window: started with the Run tab's model, device, batch and
sequence length (refused when it would not fit, as a run is), one at a time with a run or
the matmul benchmark, and its results kept with the run on show (its history entry and
journal).
"""

from __future__ import annotations

from engine.core.config import RunConfig
from engine.core.events import to_dict


class LabControl:
    """The numerics lab's runs from a MainWindow (a mixin: the window's constructor makes
    ``lab_worker`` and connects its signals here)."""

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
