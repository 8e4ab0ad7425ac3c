"""How a trial's process starts: on the CPU forked from a server that imported the trial code
once, on a GPU a new interpreter (engine.run.trial_process). Real processes, read as psutil
and the child itself see them."""

from __future__ import annotations

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
