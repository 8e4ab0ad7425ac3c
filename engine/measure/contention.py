"""How busy the machine is: other programs slow a trial's steps without adding noise.

A steady slowdown during one trial passes every spread check (its CV stays small) and
ranks the precisions wrongly, so the monitor samples the host's load on every poll
(``LoadSampler``), each trial keeps a summary of it (``summarise``), and the speed
ranking refuses to rank when ``CONTENTION_RULE`` says the host was busy
(``contention_problems``).

The change between trials is judged on other processes' CPU share, not on the load
average: the 1-minute load average counts this run's own trial and lags by about a
minute, so it rises through the first trial on an idle machine by itself.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

from engine.core.events import HostLoad, MonitorSample, TrialResult
from engine.measure.process_tree import descendant_pids

OTHER_CPU_LIMIT_PCT = 25.0  # other processes above this share of all cores: busy host
LOAD_CHANGE_LIMIT_PCT = 15.0  # other processes' share moving more between trials: drift
# the load average counts this run's own threads (torch uses every core on a CPU run), so
# only a load above twice the cores says the host is oversubscribed by itself; moderate
# contention is what other processes' CPU share measures
OVERSUBSCRIBED_PER_CORE = 2.0
CONTENTION_RULE = (
    "speeds are not ranked when, during a trial, the 1-minute load average was above "
    f"{OVERSUBSCRIBED_PER_CORE:g}x the number of CPU cores (oversubscribed) or processes "
    "outside this run used more than "
    f"{OTHER_CPU_LIMIT_PCT:.0f}% of all cores, or when that share differed between trials "
    f"by more than {LOAD_CHANGE_LIMIT_PCT:.0f} percentage points"
)


def parse_loadavg(text: str) -> float | None:
    """The 1-minute load average from /proc/loadavg's text ("0.52 0.58 0.59 2/812 4242")."""
    try:
        return float(text.split()[0])
    except (IndexError, ValueError):
        return None


def read_loadavg() -> str | None:
    try:
        with open("/proc/loadavg", encoding="ascii") as fh:
            return fh.read()
    except OSError:
        return None


def cpu_count() -> int:
    return os.cpu_count() or 1


class LoadSampler:
    """The host's load on each ``sample()``: the 1-minute load average and the CPU share
    of processes outside this one and its trial children, since the previous sample.

    The share is (busy time of all cores - busy time of this process tree) / (wall time
    x cores), from the kernel's counters; a tick where the tree gained or lost a process
    gives None (the new or gone process's time would be misattributed).
    """

    def __init__(self, loadavg: Callable[[], str | None] = read_loadavg):
        import psutil

        self._psutil = psutil
        self._loadavg = loadavg
        self._me = psutil.Process()
        self._procs: dict[int, object] = {}
        self._cores = cpu_count()
        self._last: tuple[float, float, dict[int, float]] | None = None

    def _tree_busy_s(self) -> dict[int, float]:
        try:
            pids = descendant_pids(self._me)
        except self._psutil.Error:
            pids = []
        # one Process object per pid, kept between polls: making one reads its stat file
        procs = {self._me.pid: self._me}
        for pid in pids:
            try:
                procs[pid] = self._procs.get(pid) or self._psutil.Process(pid)
            except self._psutil.Error:  # it ended since the walk
                continue
        self._procs = procs
        busy = {}
        for pid, proc in procs.items():
            try:
                t = proc.cpu_times()
            except self._psutil.Error:
                continue
            busy[pid] = t.user + t.system
        return busy

    def _other_cpu_pct(self) -> float | None:
        now = time.monotonic()
        t = self._psutil.cpu_times()
        # guest time is already inside user time on Linux; idle and iowait are not busy
        busy = sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq",
                                                 "steal"))
        tree = self._tree_busy_s()
        last, self._last = self._last, (now, busy, tree)
        if last is None or set(last[2]) != set(tree):
            return None
        wall = (now - last[0]) * self._cores
        if wall <= 0:
            return None
        other = (busy - last[1]) - (sum(tree.values()) - sum(last[2].values()))
        return min(100.0, max(0.0, 100.0 * other / wall))

    def sample(self) -> dict:
        text = self._loadavg()
        return {"load_avg_1m": parse_loadavg(text) if text else None,
                "other_cpu_pct": self._other_cpu_pct()}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarise(samples: Sequence[MonitorSample], cores: int) -> HostLoad | None:
    """The load over ``samples`` (those taken while one trial ran); None without any."""
    loads = [s.load_avg_1m for s in samples if s.load_avg_1m is not None]
    others = [s.other_cpu_pct for s in samples if s.other_cpu_pct is not None]
    if not loads and not others:
        return None
    return HostLoad(cpu_count=cores, samples=len(samples),
                    load_avg_1m_mean=_mean(loads), load_avg_1m_max=max(loads, default=None),
                    other_cpu_pct_mean=_mean(others), other_cpu_pct_max=max(others, default=None))


def contention_problems(trials: Sequence[TrialResult]) -> list[str]:
    """What ``CONTENTION_RULE`` finds in the trials' host load, one sentence each."""
    problems = []
    shares = []
    for t in trials:
        load = t.host_load
        if load is None:
            continue
        limit = OVERSUBSCRIBED_PER_CORE * load.cpu_count
        if load.load_avg_1m_mean is not None and load.load_avg_1m_mean > limit:
            problems.append(f"the host was oversubscribed during {t.precision}: 1-minute load "
                            f"average {load.load_avg_1m_mean:.1f} on {load.cpu_count} cores "
                            f"(limit {limit:g})")
        if load.other_cpu_pct_mean is not None:
            shares.append((load.other_cpu_pct_mean, t.precision))
            if load.other_cpu_pct_mean > OTHER_CPU_LIMIT_PCT:
                problems.append(f"other processes used {load.other_cpu_pct_mean:.0f}% of the "
                                f"CPU during {t.precision} (limit {OTHER_CPU_LIMIT_PCT:.0f}%)")
    if len(shares) >= 2:
        low, high = min(shares), max(shares)
        if high[0] - low[0] > LOAD_CHANGE_LIMIT_PCT:
            problems.append(f"the load changed between trials: other processes used "
                            f"{low[0]:.0f}% of the CPU during {low[1]} and {high[0]:.0f}% "
                            f"during {high[1]} (limit {LOAD_CHANGE_LIMIT_PCT:.0f} points)")
    return problems
