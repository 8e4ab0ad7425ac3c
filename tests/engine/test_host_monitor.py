"""The host monitor measures this process and its descendants, not the machine (#19).

Checked through the Recorder's own monitor samples against what the test arranges and
psutil reports for the processes it started.
"""

import os
import signal
import subprocess
import sys
import time

import psutil
import torch

import ampscope
from engine.record.journal import read_journal
from tests.engine.test_recorder import tiny_gpt2

BUSY = "import time\nt = time.time()\nwhile time.time() - t < {seconds}: pass\n"
# started by a process that exits at once: the busy one is no descendant of ours
# (its output not inherited: a reader of ours would wait for it to end)
DETACHED = ("import subprocess, sys\n"
            "p = subprocess.Popen([sys.executable, '-c', {code!r}], "
            "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "print(p.pid, flush=True)\n")
HOLDS_MEMORY = ("import time\nb = bytearray(300 * 2**20)\nprint('ready', flush=True)\n"
                "time.sleep(30)\n")


def _record_idle(tmp_path, seconds: float):
    model = tiny_gpt2()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with ampscope.Recorder(model, opt, journal=tmp_path / "h.jsonl", monitor_hz=10) as rec:
        end = time.time() + seconds
        while time.time() < end:
            time.sleep(0.1)
        rec.step()
    return read_journal(tmp_path / "h.jsonl").monitor_samples


def test_cpu_is_this_processs_not_the_machines(tmp_path):
    outer = subprocess.run([sys.executable, "-c",
                            DETACHED.format(code=BUSY.format(seconds=60))],
                           capture_output=True, text=True, check=True)
    busy = int(outer.stdout.split()[0])
    try:
        assert busy not in {p.pid for p in psutil.Process().children(recursive=True)}
        psutil.cpu_percent(None)
        samples = _record_idle(tmp_path, 1.5)
        machine = psutil.cpu_percent(None)  # machine-wide over the same window
    finally:
        try:
            os.kill(busy, signal.SIGKILL)
        except ProcessLookupError:  # it ended on its own
            pass
    assert machine >= 40  # the premise: one of the cores was busy, outside this process
    cpu = [m.cpu_pct for m in samples[1:]]  # the first poll primes the counters
    assert cpu and max(cpu) < 30  # this process only slept


def test_memory_counts_this_processs_children(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", HOLDS_MEMORY], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        child_rss = psutil.Process(child.pid).memory_info().rss
        own_rss = psutil.Process().memory_info().rss
        samples = _record_idle(tmp_path, 0.6)
    finally:
        child.kill()
        child.wait()
    assert child_rss >= 300 * 2**20
    rss = [m.host_rss_bytes for m in samples]
    assert rss and min(rss) >= child_rss + 0.9 * own_rss
