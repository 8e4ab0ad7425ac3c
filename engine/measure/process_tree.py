"""The processes a run started (trial children, data-loader workers), found cheaply.

psutil's ``Process.children(recursive=True)`` reads the stat file of every process on the
machine to learn their parents: milliseconds with a hundred processes, tens with a
thousand, and the monitor asks at every poll while the training loop wants the cores.
Linux lists each thread's own children in ``/proc/<pid>/task/<tid>/children``, so the
tree is a few small reads per thread of its own processes. Elsewhere (macOS, Windows, a
kernel built without CONFIG_PROC_CHILDREN) psutil's walk is used.
"""

from __future__ import annotations

import functools
import os

import psutil


@functools.cache
def _children_files() -> bool:
    """Whether this kernel lists a thread's children (the main thread has the file)."""
    pid = os.getpid()
    return os.path.exists(f"/proc/{pid}/task/{pid}/children")


def _children_of(pid: int) -> list[int]:
    """Direct children of ``pid``: the children of each of its threads. A process or thread
    that ended meanwhile has none."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    kids = []
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                kids += [int(k) for k in fh.read().split()]
        except OSError:
            continue
    return kids


def descendant_pids(proc: psutil.Process) -> list[int]:
    """The pids of ``proc``'s descendants (children, their children...), unordered."""
    if not _children_files():
        return [child.pid for child in proc.children(recursive=True)]
    found: list[int] = []
    seen = {proc.pid}
    todo = [proc.pid]
    while todo:
        for kid in _children_of(todo.pop()):
            if kid not in seen:  # lists read at different moments cannot loop us
                seen.add(kid)
                found.append(kid)
                todo.append(kid)
    return found
