"""A stopped trial shows what it measured and nothing else, in the configured order."""

import pytest

from engine.core.config import RunConfig
from engine.core.events import PhaseChanged
from engine.record.compare import comparison_rows, format_table
from engine.record.journal import read_journal
from engine.run.runner import Runner

TINY = dict(model="tiny", batch_size=1, seq_len=16, device="cpu", isolation="inline")


@pytest.fixture(autouse=True)
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path))


def _run_stopped_at(config: RunConfig, precision: str, round_: int, phase: str):
    events: list = []

    def on_event(event) -> None:
        events.append(event)
        if (isinstance(event, PhaseChanged) and (event.precision, event.round, event.phase)
                == (precision, round_, phase)):
            runner.cancel()  # as the Stop button does, from the listener

    runner = Runner(config, on_event)
    return runner.run(), runner


def test_stopped_in_its_first_warm_up_step_has_no_peak(tmp_path):
    record, _ = _run_stopped_at(RunConfig(**TINY, precisions=("fp32",), steps=5, warmup=2),
                                "fp32", 0, "warm-up")
    (trial,) = record.trials
    assert trial.status == "cancelled"
    assert [s.warmup for s in trial.steps] == [True]  # the step under way finished
    assert trial.summary.steps_measured == 0
    assert trial.summary.median_step_ms is None
    # no step was watched: the bytes held at rest are kept, but are no peak
    assert trial.summary.peak_memory_bytes is None
    assert "stopped before the watched step" in trial.summary.peak_memory_method
    params = sum(p.nbytes for p in _tiny_fp32_params())
    assert trial.memory.params_bytes == params
    assert "not the peak" in trial.memory.total_method
    row = comparison_rows(record)[0]
    assert row.peak_memory_bytes is None
    line = next(x for x in format_table([row]).splitlines() if x.startswith("fp32 "))
    assert f"{params / 2**20:.2f} MiB" not in line and "n/a" in line


def _tiny_fp32_params():
    from engine.models.load import load_model

    return list(load_model("tiny", "fp32", "cpu", 0, False).model.parameters())


def test_stopped_interleaved_run_lists_trials_in_the_configured_order():
    config = RunConfig(**TINY, precisions=("fp32", "bf16-amp"), steps=4, warmup=1,
                       interleave="on", rounds=2, profile_step=False)
    # bf16-amp is stopped in its first round, before fp32's second round ever starts:
    # bf16-amp finishes first, fp32 second
    record, runner = _run_stopped_at(config, "bf16-amp", 0, "measuring")
    assert [t.precision for t in record.trials] == ["fp32", "bf16-amp"]
    assert [t.status for t in record.trials] == ["cancelled", "cancelled"]
    fp32, bf16 = record.trials
    assert [s.round for s in fp32.steps] == [0, 0, 0]  # its first round only
    # the memory step runs in a precision's last round (its figures are the result's): a
    # precision stopped before it keeps what its first round held at rest, never as a peak
    assert fp32.summary.peak_memory_bytes is None and fp32.memory.params_bytes > 0
    assert "stopped before the watched step" in fp32.summary.peak_memory_method
    assert bf16.summary.peak_memory_bytes is None
    # the journal, read back, keeps that order too
    assert [t.precision for t in read_journal(runner.journal_path).trials] == ["fp32",
                                                                               "bf16-amp"]
