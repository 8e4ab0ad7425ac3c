"""A trial's own process, started before the device is free and held until it is.

Starting a trial process costs seconds (the interpreter, torch, transformers, the model's
class), all of it on the host. The runner starts the next trial's process while the
current trial runs its untimed steps (``PREFETCH_AT``); the new process imports and then
blocks on its inbox, touching neither the device nor a model (no CUDA call, no allocation,
no build) until the runner hands it its trial, which it does only after the previous
trial's process is gone. Each trial still runs in a process of its own, with clean memory
figures; only its start-up leaves the run's critical path.

On the CPU a trial's process is forked from a forkserver that imported torch, transformers
and the trial code once (``engine.run.trial_preload``): ready in a fraction of a second
instead of a new interpreter's ten of import on a busy 2-core machine, where the imports of
the next trial outlasted the current one's untimed steps. A CUDA trial keeps a spawned
interpreter: a process that forks must not have started the CUDA driver, and a library
imported in the server may ask CUDA at import (``torch.cuda.is_available()`` starts the
driver and marks forked children unable to use it unless NVML answers); forking has not
been tried on a GPU.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from dataclasses import dataclass

from engine.core.child import StderrFile, become_child, exit_child, sigint_blocked
from engine.core.collector import imports_paused
from engine.core.events import TrialFinished, TrialResult
from engine.core.quiet import quiet_libraries
from engine.record.bounded import traceback_text

FORKSERVER_PRELOAD = ["engine.run.trial_preload"]
START_TEXT = {  # the run's log says how its trial processes start
    "forkserver": "trial processes are forked from a server that imported torch, transformers "
                  "and the trial code once (each trial still has a process of its own)",
    "spawn": "trial processes start as new interpreters (spawn): a GPU trial's process must "
             "not be forked from one that may have started the CUDA driver (and a system "
             "without a forkserver spawns on the CPU too)",
}


def start_method(device_kind: str) -> str:
    """How a trial's process starts on ``device_kind`` ("cpu" or "cuda")."""
    if device_kind == "cpu" and "forkserver" in mp.get_all_start_methods():
        return "forkserver"
    return "spawn"


# a GPU driver's device nodes: without any, --device auto can only mean the CPU
GPU_NODES = ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/kfd")


def cpu_certain(device: str) -> bool:
    """Whether a run asked for ``device`` will run on the CPU, known without importing torch."""
    device = device.strip().lower()
    return device == "cpu" or (device == "auto" and not any(map(os.path.exists, GPU_NODES)))


def start_server(device: str) -> bool:
    """Start the CPU trials' forkserver now, if a run on ``device`` will fork from it: its
    imports (seconds) then overlap the caller's own (the CLI's, the device probe, the
    initial weights) instead of the first trial waiting for them. Returns whether it did;
    starting it again is a no-op."""
    if not cpu_certain(device) or start_method("cpu") != "forkserver":
        return False
    from multiprocessing import forkserver

    mp.get_context("forkserver").set_forkserver_preload(FORKSERVER_PRELOAD)
    with sigint_blocked():  # the server must outlive a Ctrl-C the run itself handles
        forkserver.ensure_running()
    return True


SERVER_LOST = 255  # the exit code multiprocessing gives a forked trial whose server died


def server_death() -> str | None:
    """How the trials' forkserver ended ("killed (SIGKILL)"), None while it runs or where
    there is none. Its status is peeked at (WNOWAIT), never reaped: multiprocessing reaps it
    itself when it starts the next trial's server."""
    from multiprocessing import forkserver

    from engine.core.child import describe_exit

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if pid is None:
        return None
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except (OSError, AttributeError):  # not our child any more, or no waitid (macOS)
        return None
    if info is None:
        return None
    killed = info.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
    return describe_exit(-info.si_status if killed else info.si_status)


# the current trial's phases that start the next trial's process (the first after its
# measured steps): what is left (the memory and profiled steps, teardown) is untimed; a round
# before an interleaved precision's last has no memory step. On the CPU the profiled step
# then shares the cores with the imports: its times are for shares anyway.
PREFETCH_AT = ("memory step", "profiled step")


@dataclass(frozen=True)
class ChildReady:
    """Sent by a trial process once it has imported what a trial needs, before it waits."""

    entry_s: float  # its first line of code ran (epoch seconds)
    ready_s: float  # its imports were done
    cuda_initialized: bool  # torch.cuda.is_initialized() at that moment: must be False
    preloaded: bool  # the trial code was in memory at its first line (forked from the server)


@dataclass(frozen=True)
class TrialTask:
    """What the runner hands a ready process: the trial to run, now that the device is free."""

    config: dict
    precision: str
    info: object  # engine.measure.device.DeviceInfo
    prior_steps: tuple = ()
    round_index: int = 0
    prior_flops: object = None  # engine.measure.flops.FlopsInfo of an earlier round


def _preload(model: str, trust_remote_code: bool) -> None:
    """Import what a trial of ``model`` imports, and nothing that touches the device: the
    engine's trial code (torch, transformers, the profiler) and the model's own class."""
    import engine.run.trial  # noqa: F401
    from engine.models.hf import model_class
    from engine.models.load import load_config, resolve_source

    try:
        config, task = load_config(resolve_source(model), trust_remote_code)
        model_class(task)._model_mapping[type(config)]  # imports the family's modelling code
    except Exception:  # noqa: S110 (a bad model is the trial's error to report, not this)
        pass


def _worker_main(model: str, trust_remote_code: bool, out, inbox, cancel, parent_pid: int,
                 stderr_path: str, environ: dict) -> None:
    entry_s = time.time()
    preloaded = "engine.run.trial" in sys.modules
    become_child(parent_pid, stderr_path)
    # a forked child has the server's environment, as it was when the server started: the
    # runner's, now, is what a spawned child would have had
    os.environ.clear()
    os.environ.update(environ)
    quiet_libraries()
    try:
        with imports_paused():  # a spawned trial's seconds of torch and transformers
            _preload(model, trust_remote_code)
    except BaseException:  # noqa: S110 (the trial's own imports say what is wrong)
        pass
    import torch

    out.put(ChildReady(entry_s, time.time(), torch.cuda.is_initialized(), preloaded))
    task = inbox.get()  # the barrier: the device is free when this arrives
    if task is None:  # the run ended before this process was needed
        exit_child(0)
    try:
        from engine.core.config import RunConfig
        from engine.run.trial import run_trial

        config = RunConfig.from_dict(task.config)
        result = run_trial(config, task.precision, task.info, out.put, cancel.is_set,
                           task.prior_steps, task.round_index, task.prior_flops)
    except BaseException as exc:  # run_trial never raises; this is the last line of defence
        result = TrialResult(task.precision, "error", f"{type(exc).__name__}: {exc}",
                             traceback=traceback_text(exc))
    out.put(TrialFinished(result, time.time()))
    # the result must be in the pipe before anything else (a sticky CUDA error at
    # interpreter exit) can take the process down
    out.close()
    out.join_thread()
    exit_child(0)


class TrialProcess:
    """One trial process: started now, handed its trial later (``hand``)."""

    def __init__(self, model: str, trust_remote_code: bool, device_kind: str) -> None:
        self.start_method = start_method(device_kind)
        ctx = mp.get_context(self.start_method)
        if self.start_method == "forkserver":  # read when the server starts: the first trial
            ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
        self.out, self.inbox, self.cancel = ctx.Queue(), ctx.Queue(), ctx.Event()
        self.stderr = StderrFile()
        self.process = ctx.Process(
            target=_worker_main,
            args=(model, trust_remote_code, self.out, self.inbox, self.cancel, os.getpid(),
                  self.stderr.path, dict(os.environ)),
            name="ampscope-trial", daemon=True)
        self.spawn_s = time.time()
        with sigint_blocked():
            self.process.start()
        self.handed_s: float | None = None
        self.early = False  # started while another trial held the device

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.is_alive()

    def hand(self, task: TrialTask) -> None:
        self.handed_s = time.time()
        self.inbox.put(task)

    def release(self) -> None:
        """A process never handed a trial: it exits at once (ended if it does not)."""
        if self.handed_s is None and self.alive():
            try:
                self.inbox.put(None)
            except (OSError, ValueError):
                pass
        self.inbox.close()
        self.inbox.join_thread()
