import multiprocessing
import os
import signal
from pathlib import Path

import pytest

from engine.core.config import RunConfig
from engine.core.events import (
    ErrorEvent,
    MonitorSample,
    RunFinished,
    RunStarted,
    StepSample,
    TrialFinished,
    TrialStarted,
)
from engine.record.run_record import RunRecord
from engine.run import trial_setup, trial_state
from engine.run.runner import Runner


def _config(**kw):
    base = dict(model="tiny", precisions=("fp32", "bf16"), batch_size=1, seq_len=16, steps=2,
                warmup=0, device="cpu", isolation="inline")
    base.update(kw)
    return RunConfig(**base)


def test_inline_run_emits_events_in_order_and_fills_the_record():
    events = []
    record = Runner(_config(), events.append).run()
    kinds = [type(e) for e in events if not isinstance(e, MonitorSample)]
    assert kinds[0] is RunStarted and kinds[-1] is RunFinished
    assert kinds.count(TrialStarted) == 2 and kinds.count(TrialFinished) == 2
    assert any(isinstance(e, MonitorSample) and e.source == "host" for e in events)
    assert [t.status for t in record.trials] == ["ok", "ok"]
    assert record.environment["libraries"]["torch"].startswith("2.13")
    back = RunRecord.from_dict(record.to_dict())
    assert back.trials == record.trials
    assert back.monitor_samples == record.monitor_samples


def test_bad_input_is_an_error_event_then_value_error():
    events = []
    runner = Runner(_config(seq_len=100_000), events.append)
    with pytest.raises(ValueError, match="--seq-len 512"):
        runner.run()
    assert [type(e) for e in events] == [ErrorEvent]
    assert runner.record.status == "error" and "--seq-len" in runner.record.logs[0].message


def test_a_failing_trial_does_not_stop_the_run(monkeypatch):
    real = trial_setup.load_model

    def flaky(model, recipe, *a, **k):
        if recipe.precision == "fp32":
            raise RuntimeError("driver fell over")
        return real(model, recipe, *a, **k)

    monkeypatch.setattr(trial_setup, "load_model", flaky)
    record = Runner(_config()).run()
    assert [(t.precision, t.status) for t in record.trials] == [("fp32", "error"), ("bf16", "ok")]
    assert record.status == "ok"


def test_cancel_mid_run_keeps_measured_steps_and_marks_the_rest():
    runner = None

    def on_event(event):
        if isinstance(event, StepSample):
            runner.cancel()

    runner = Runner(_config(steps=20), on_event)
    record = runner.run()
    first, second = record.trials
    assert first.status == "cancelled" and len(first.steps) >= 1
    assert second.status == "cancelled" and "before this trial started" in second.reason
    assert record.status == "cancelled"


def test_child_process_trial_and_a_killed_child_ends_only_its_trial():
    """Process isolation: SIGKILL (the OOM killer's signal, among others) ends one trial."""
    killed = []

    def on_event(event):
        if isinstance(event, StepSample) and event.precision == "fp32" and not killed:
            child = multiprocessing.active_children()[0]
            killed.append(child.pid)
            os.kill(child.pid, signal.SIGKILL)

    record = Runner(_config(isolation="process", steps=200), on_event).run()
    fp32, bf16 = record.trials
    assert killed
    assert fp32.status == "error" and "killed (SIGKILL)" in fp32.reason and fp32.steps
    assert "out-of-memory killer is one possibility" in fp32.reason
    assert fp32.summary.steps_measured == len(fp32.steps) - 1  # one warm-up step
    # every round warms up one step (--warmup 0 still runs one), the 200 are measured
    assert bf16.status == "ok" and sum(not s.warmup for s in bf16.steps) == 200


CRASHING_MODEL = '''
import os
import sys

from transformers import GPT2Config, GPT2LMHeadModel


class CrashConfig(GPT2Config):
    model_type = "ampscope-crash"


class CrashModel(GPT2LMHeadModel):
    config_class = CrashConfig

    def forward(self, *args, **kwargs):
        if self.config.crash == "abort":  # what a native library's fatal error looks like
            sys.stderr.write("native library exploded: bad things happened\\n")
            sys.stderr.flush()
            os.abort()
        # a device-side assert: an index past the end, checked on the GPU
        ids = kwargs["input_ids"]
        ids.new_zeros(1)[ids.new_full((1,), 5)].sum().item()
        return super().forward(*args, **kwargs)
'''


def _crashing_folder(tmp_path, crash: str):
    """A remote-code model folder whose forward crashes the way ``crash`` says."""
    import json

    folder = tmp_path / f"crash-{crash}"
    folder.mkdir()
    (folder / "crash_model.py").write_text(CRASHING_MODEL)
    config = {"model_type": "ampscope-crash", "crash": crash, "n_layer": 1, "n_head": 2,
              "n_embd": 32, "n_positions": 64, "vocab_size": 128,
              "architectures": ["CrashModel"],
              "auto_map": {"AutoConfig": "crash_model.CrashConfig",
                           "AutoModelForCausalLM": "crash_model.CrashModel"}}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_child_that_dies_gives_its_signal_and_last_output(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # remote code is copied there
    folder = _crashing_folder(tmp_path, "abort")
    config = _config(model=str(folder), precisions=("fp32",), isolation="process",
                     trust_remote_code=True)
    (trial,) = Runner(config).run().trials
    assert trial.status == "error"
    assert "killed (SIGABRT)" in trial.reason
    assert "native library exploded: bad things happened" in trial.reason


@pytest.mark.gpu
def test_a_device_side_assert_is_that_trials_error_and_the_next_trial_runs(tmp_path,
                                                                           monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    folder = _crashing_folder(tmp_path, "device-assert")
    config = _config(model=str(folder), precisions=("fp32",), isolation="process",
                     trust_remote_code=True, device="cuda")
    (trial,) = Runner(config).run().trials
    assert trial.status == "error" and "device-side assert" in trial.reason
    after = Runner(_config(precisions=("fp32",), isolation="process", device="cuda")).run()
    assert after.trials[0].status == "ok"


@pytest.mark.parametrize(
    ("exc", "status", "fragment"),
    [
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"),
         "oom", "out of GPU memory"),
        (MemoryError(), "oom", "raise the memory limit"),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8"),
         "oom", "out of host memory"),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), "error",
         "illegal memory access"),
    ],
)
def test_failures_are_classified(exc, status, fragment):
    got_status, reason = trial_state.failure(exc)
    assert got_status == status and fragment in reason


def test_host_out_of_memory_under_a_limit_is_oom_with_advice(tmp_path):
    """A real allocation failure: the address space capped below what gpt2-large needs."""
    import subprocess
    import sys

    script = (
        "import resource, psutil\n"
        "from engine.core.config import RunConfig\n"
        "from engine.run.runner import Runner\n"
        "import engine.run.trial\n"
        "limit = psutil.Process().memory_info().vms + 1024**3\n"
        "resource.setrlimit(resource.RLIMIT_AS, (limit, limit))\n"
        "config = RunConfig(model='gpt2-large', precisions=('fp32',), batch_size=1,\n"
        "                   seq_len=16, steps=1, warmup=0, device='cpu', isolation='inline')\n"
        "(trial,) = Runner(config).run().trials\n"
        "print(trial.status, '|', trial.reason)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2])
    status, _, reason = run.stdout.strip().splitlines()[-1].partition(" | ")
    assert status == "oom", run.stdout + run.stderr
    assert "out of host memory" in reason and "memory limit" in reason

