"""How a trial's process starts: on the CPU forked from a server that imported the trial code
once, on a GPU a new interpreter (engine.run.trial_process). Real processes, read as psutil
and the child itself see them."""

from __future__ import annotations

import gc
import os

import psutil
import pytest

from engine.run.trial_process import (
    GPU_NODES,
    ChildReady,
    TrialProcess,
    cpu_certain,
    start_method,
    start_server,
)

READY_TIMEOUT_S = 600  # a first server imports torch and transformers


def _ready(proc: TrialProcess) -> ChildReady:
    ready = proc.out.get(timeout=READY_TIMEOUT_S)
    assert isinstance(ready, ChildReady), ready
    return ready


def _ended(proc: TrialProcess) -> None:
    proc.release()
    proc.process.join(60)
    proc.stderr.remove()
    assert proc.process.exitcode == 0


@pytest.mark.skipif(start_method("cpu") != "forkserver", reason="no forkserver on this system")
def test_cpu_trials_are_forked_from_a_server_that_imported_the_trial_code():
    procs = [TrialProcess("tiny", False, "cpu") for _ in range(2)]
    try:
        for proc in procs:
            ready = _ready(proc)
            # the trial code was in memory before the child's first line: no import of its own
            assert ready.preloaded and not ready.cuda_initialized
            server = psutil.Process(proc.pid).parent()
            assert server.pid != os.getpid() and server.ppid() == os.getpid()
            assert "forkserver" in " ".join(server.cmdline())
        # one server for every trial of the run
        assert len({psutil.Process(p.pid).ppid() for p in procs}) == 1
    finally:
        for proc in procs:
            _ended(proc)


def test_gpu_trials_start_as_new_interpreters():
    """A CUDA trial is never forked (here on the CPU the child is only started and ended:
    it touches no device before it is handed a trial)."""
    assert start_method("cuda") == "spawn"
    proc = TrialProcess("tiny", False, "cuda")
    try:
        ready = _ready(proc)
        assert not ready.preloaded and not ready.cuda_initialized
        assert psutil.Process(proc.pid).ppid() == os.getpid()
    finally:
        _ended(proc)



def test_the_server_starts_before_a_run_needs_it_only_where_trials_fork():
    """The CLI and the runner start the server first thing, so its imports overlap theirs:
    only for a run that is sure to be on the CPU (a GPU trial spawns and needs no server)."""
    assert cpu_certain("cpu") and cpu_certain(" CPU ")
    assert not cpu_certain("cuda") and not cpu_certain("cuda:1")
    assert cpu_certain("auto") == (not any(os.path.exists(p) for p in GPU_NODES))
    assert not start_server("cuda")
    if start_method("cpu") != "forkserver":
        assert not start_server("cpu")
        return
    from multiprocessing import forkserver

    assert start_server("cpu")
    server = forkserver._forkserver._forkserver_pid
    assert "forkserver" in " ".join(psutil.Process(server).cmdline())
    assert start_server("cpu")  # again: the same server
    assert forkserver._forkserver._forkserver_pid == server
    proc = TrialProcess("tiny", False, "cpu")
    try:
        assert _ready(proc).preloaded
        assert psutil.Process(proc.pid).ppid() == server  # the trial forks from it
    finally:
        _ended(proc)


def test_the_server_prepares_what_every_fork_would_redo():
    """The server's preload builds transformers' checkpoint renaming table (every trial's
    from_pretrained reads it) and freezes its objects out of the children's collections."""
    import subprocess
    import sys

    code = ("import gc, engine.run.trial_preload\n"
            "from transformers import conversion_mapping as c\n"
            "print(gc.get_freeze_count() > 0, c._checkpoint_conversion_mapping_cache is not None,"
            " gc.isenabled())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=READY_TIMEOUT_S)
    # imported with the collector paused, on again for the children it forks
    assert done.stdout.split() == ["True", "True", "True"]


def test_the_cli_starts_the_server_before_its_own_imports(monkeypatch, capsys):
    import engine.cli
    import engine.run.fits
    import engine.run.trial_process

    calls = []
    monkeypatch.setattr(engine.run.trial_process, "start_server",
                        lambda device: calls.append(("server", device)))

    def refuse(config):
        # the checks' imports run with the collector paused (engine.core.collector)
        calls.append(("fits", config.device, gc.isenabled()))
        raise ValueError("refused here, to end the test")

    monkeypatch.setattr(engine.run.fits, "refuse_if_too_big", refuse)
    assert engine.cli.main(["profile", "--model", "tiny", "--device", "cpu"]) == 2
    assert calls == [("server", "cpu"), ("fits", "cpu", False)]
    assert gc.isenabled()  # on again, also after a refusal
    calls.clear()  # inline trials need no server
    engine.cli.main(["profile", "--model", "tiny", "--device", "cpu", "--isolation", "inline"])
    assert calls == [("fits", "cpu", False)]


def test_a_cli_run_trains_with_the_collector_on(tmp_path, monkeypatch):
    """Paused for the imports only: the trials (inline here) run with it collecting."""
    import engine.cli
    import engine.run.trial

    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path / "data"))
    seen = []
    own = engine.run.trial.run_trial

    def trial(*args, **kwargs):
        seen.append(gc.isenabled())
        return own(*args, **kwargs)

    monkeypatch.setattr(engine.run.trial, "run_trial", trial)
    assert engine.cli.main(["profile", "--model", "tiny", "--device", "cpu", "--isolation",
                            "inline", "--precision", "fp32", "--steps", "1", "--warmup", "1",
                            "--no-kernel-profile", "--no-quant-error", "--quiet"]) == 0
    assert seen == [True]


def test_a_headless_command_exits_with_its_heap_frozen():
    """The console script freezes the heap once a command is done: the interpreter's last
    collections at exit skip it, and the atexit handlers still run."""
    import subprocess
    import sys

    code = ("import atexit, gc, sys\n"
            "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))\n"
            "sys.argv = ['ampscope', '--version']\n"
            "from ampscope.cli import run\n"
            "run()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=READY_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "frozen True"


@pytest.mark.skipif(start_method("cpu") != "forkserver", reason="no forkserver on this system")
def test_the_first_forked_trial_process_starts_after_the_weights_are_drawn(tmp_path,
                                                                          monkeypatch):
    """A fork waits for the server's imports: asked for after the draw, it overlaps them."""
    from engine.core.config import RunConfig
    from engine.core.events import LogEvent
    from engine.run.runner import Runner
    from engine.run.trial_process import START_TEXT

    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path / "data"))
    created = []
    own = TrialProcess.__init__

    def init(self, *args):
        created.append("process")
        own(self, *args)

    monkeypatch.setattr(TrialProcess, "__init__", init)
    logs = []
    config = RunConfig(model="tiny", precisions=("fp32", "bf16"), batch_size=1, seq_len=16,
                       steps=1, warmup=1, device="cpu", interleave="off", profile_step=False,
                       quant_error=False)
    record = Runner(config, lambda e: isinstance(e, LogEvent) and logs.append(
        (e.message, len(created)))).run()
    assert [t.status for t in record.trials] == ["ok", "ok"]
    drawn = next(n for m, n in logs if m.startswith("initial weights drawn once"))
    forked = next(n for m, n in logs if m == START_TEXT["forkserver"])
    assert (drawn, forked) == (0, 1)  # no process yet when the weights were drawn
