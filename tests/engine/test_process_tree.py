"""The monitor finds this process's descendants without walking the whole process table
(#19: psutil's recursive walk cost the training loop milliseconds at every poll)."""

import subprocess
import sys
import threading

import psutil
import pytest

from engine.measure import process_tree
from engine.measure.contention import LoadSampler
from engine.measure.trackers import HostTracker

# a child that starts a grandchild, then both wait for stdin to close
TREE = ("import subprocess, sys\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.read()'], "
        "stdin=subprocess.PIPE)\n"
        "print(g.pid, flush=True)\n"
        "sys.stdin.read()\n"
        "g.stdin.close(); g.wait()\n")
linux_lists = pytest.mark.skipif(not process_tree._children_files(),
                                 reason="the kernel lists no thread's children")


@pytest.fixture
def tree():
    """A child started from the main thread and one from another thread (each thread's
    children are listed apart), each with a grandchild: their four pids."""
    started = []

    def start():
        child = subprocess.Popen([sys.executable, "-c", TREE], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        started.append((child, int(child.stdout.readline())))

    start()
    worker = threading.Thread(target=start)
    worker.start()
    worker.join()
    yield {pid for child, grandchild in started for pid in (child.pid, grandchild)}
    for child, _ in started:
        child.stdin.close()
        child.wait()


def test_descendants_are_psutils_own_walk(tree):
    me = psutil.Process()
    walked = {p.pid for p in me.children(recursive=True)}  # the whole table, read by psutil
    found = process_tree.descendant_pids(me)
    assert tree <= walked
    assert sorted(found) == sorted(walked)


@linux_lists
def test_monitor_samplers_find_children_without_walking_the_table(tree, monkeypatch):
    def walk(*args, **kwargs):
        raise AssertionError("walked the whole process table")

    me = psutil.Process()
    # psutil's own walk, before it is forbidden: a test process may hold children of its
    # own besides the tree (a compile worker pool started by an earlier test)
    walked = {p.pid for p in me.children(recursive=True)}
    assert tree <= walked
    monkeypatch.setattr(psutil.Process, "children", walk)
    sampler = LoadSampler(loadavg=lambda: None)
    sampler.sample()
    assert set(sampler._tree_busy_s()) == walked | {me.pid}
    host = HostTracker()
    host.start()
    rss = sum(psutil.Process(pid).memory_info().rss for pid in walked | {me.pid})
    assert set(host._children) == walked
    assert host.sample()["host_rss_bytes"] == pytest.approx(rss, rel=0.05)
