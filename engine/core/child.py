"""Child processes that never outlive their parent and never see the terminal's Ctrl-C.

Trials and the numerics lab run in ``spawn`` children (CPU trials in children of a
forkserver, engine.run.trial_process). The parent starts them with
SIGINT blocked (the mask is inherited through fork and exec), and the child ignores
SIGINT before unblocking it: a terminal Ctrl-C, which reaches the whole foreground
process group, is the parent's to handle. On Linux the child asks the kernel to kill
it when its parent dies (``PR_SET_PDEATHSIG``); a thread that watches the parent's
pid covers the moment before that and the other systems. The child's stderr goes to a
file, so the tail of it can explain a child that died without reporting.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

PR_SET_PDEATHSIG = 1
PARENT_POLL_S = 0.5
STDERR_TAIL_CHARS = 1500


def _set_pdeathsig(sig: int = signal.SIGKILL) -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the watcher thread still ends us
        pass


def end_with_parent(sig: int = signal.SIGKILL) -> None:
    """For a process this one did not start through ``become_child`` (torchrun's launcher
    and its ranks): the kernel sends ``sig`` when the parent dies, and a thread ends it
    if the parent was already gone or prctl is missing."""
    parent = os.getppid()
    _set_pdeathsig(sig)
    if os.getppid() != parent or parent == 1:
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), name="ampscope-parent-watch",
                     daemon=True).start()


def _parent_of(pid: int) -> int | None:
    try:
        return psutil.Process(pid).ppid()
    except psutil.Error:
        return None


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie has: its parent has not reaped it yet)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _watch_parent(parent_pid: int, owner_pid: int | None = None) -> None:
    while True:
        if os.getppid() != parent_pid or (owner_pid is not None and _gone(owner_pid)):
            os._exit(1)  # the parent is gone: nobody reads our results
        time.sleep(PARENT_POLL_S)


def become_child(parent_pid: int, stderr_path: str | None) -> None:
    """First thing a child does: SIGINT ignored, bound to the parent's life, stderr to a file.

    ``parent_pid`` is the process that reads the child's results: its parent, or for a
    child a forkserver forked, the server's parent (the server ends when that one does, its
    alive pipe closed, and the kernel's death signal then ends the child)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    _set_pdeathsig()
    direct = os.getppid()
    if direct != parent_pid and _parent_of(direct) != parent_pid:
        os._exit(1)  # the parent died before the death signal was armed
    # a forkserver outlives its parent while any child it forked lives (each holds the
    # server's alive pipe): a child waiting for a trial watches the reader of its results too
    owner = parent_pid if direct != parent_pid else None
    threading.Thread(target=_watch_parent, args=(direct, owner), name="ampscope-parent-watch",
                     daemon=True).start()
    if stderr_path:
        fd = os.open(stderr_path, os.O_WRONLY | os.O_APPEND)
        sys.stderr.flush()
        os.dup2(fd, 2)
        os.close(fd)


def exit_child(code: int = 0) -> None:
    """End a child at once (``os._exit``: no interpreter teardown, where a sticky CUDA error
    could still take it down) after multiprocessing's exit finalisers. A named semaphore a
    library made in the child under a spawn or forkserver context (CUDA libraries cannot
    fork) is registered with the resource tracker the parent shares; its finaliser unlinks
    and unregisters it, and ``os._exit`` alone skips it: on an H200 the tracker warned of
    one "leaked semaphore" per trial at the end of the run."""
    try:
        from multiprocessing import util

        util._run_finalizers(0)  # those with an exit priority: what a normal exit runs first
    except Exception:  # noqa: S110 - the exit must happen whatever a finaliser does
        pass
    os._exit(code)


@contextlib.contextmanager
def sigint_blocked():
    """Block SIGINT in this thread while a child is started, so it inherits the block."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class StderrFile:
    """A temporary file that receives a child's stderr; its tail explains a crash."""

    def __init__(self) -> None:
        fd, path = tempfile.mkstemp(prefix="ampscope-child-", suffix=".stderr")
        os.close(fd)
        self.path = path

    def tail(self, chars: int = STDERR_TAIL_CHARS) -> str:
        try:
            text = Path(self.path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        text = text.strip()
        return text if len(text) <= chars else "…" + text[-chars:]

    def remove(self) -> None:
        Path(self.path).unlink(missing_ok=True)


def describe_exit(exitcode: int | None) -> str:
    """``exited with code 3`` or ``killed (SIGKILL)``."""
    if exitcode is None:
        return "did not exit"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"killed ({name})"
    return f"exited with code {exitcode}"


def oom_kill_count() -> int | None:
    """The cgroup's out-of-memory kill counter (cgroup v2), or None where there is none."""
    try:
        line = Path("/proc/self/cgroup").read_text().strip().splitlines()[0]
        group = line.split(":", 2)[2]
        events = Path("/sys/fs/cgroup" + group) / "memory.events"
        for row in events.read_text().splitlines():
            key, _, value = row.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, IndexError, ValueError):
        return None
    return None
