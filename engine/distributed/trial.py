"""The parent side of a distributed trial: start torchrun, follow the ranks, build the result.

torchrun runs in a child (``engine.distributed.launch``) in its own session; the ranks
write JSON lines that are read here while they run. A step is shown once every local
rank has finished it: its time is the slowest rank's. A rank that dies makes torchrun's
agent stop the others; whatever is still alive below the launcher when it ends
(or when a cancel outlasts its grace) is killed, so no process outlives the trial.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import psutil

from engine.core.config import RunConfig
from engine.core.events import (
    CommVolume,
    DistributedSummary,
    LogEvent,
    MemoryBreakdown,
    MonitorSample,
    PredictedMemory,
    RankMemory,
    RankResult,
    StepSample,
    TrialResult,
    TrialSummary,
    from_dict,
)
from engine.distributed.recipes import dist_recipe, unsupported_reason
from engine.measure import nvml
from engine.measure.device import DeviceInfo

ROOT = Path(__file__).resolve().parents[2]
CANCEL_GRACE_S = 30.0
POLL_S = 0.1
# a hung rank (a lost peer, a deadlocked collective) would hold the trial forever: after
# the first step, no new step from some rank for this many median steps ends the trial
STALL_FACTOR = 20
STALL_FLOOR_S = 300.0
# a stalled trial's ranks are not waited for as long as a cancelled one's: the hung rank
# will not stop when asked (torchrun would wait its own 30 s for it), and its peers, which
# handle no SIGTERM, end at once
STALL_GRACE_S = 5.0


class _Follower:
    """Reads the ranks' JSON-lines files as they grow (whole lines only)."""

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        self.offsets: dict[Path, int] = {}
        self.ranks: dict[int, dict] = {}  # rank -> {"start", "steps", "result", "failed"}

    def poll(self) -> list[tuple[int, str, dict]]:
        new = []
        for path in sorted(self.out_dir.glob("rank*.jsonl")):
            rank = int(path.stem.removeprefix("rank"))
            with open(path, encoding="utf-8") as fh:
                fh.seek(self.offsets.get(path, 0))
                text = fh.read()
            end = text.rfind("\n") + 1
            self.offsets[path] = self.offsets.get(path, 0) + len(text[:end].encode("utf-8"))
            for line in text[:end].splitlines():
                item = json.loads(line)
                kind = item.pop("type")
                entry = self.ranks.setdefault(rank, {"steps": []})
                if kind == "step":
                    entry["steps"].append(from_dict(StepSample, item))
                else:
                    entry[kind] = item
                new.append((rank, kind, item))
        return new


def run_distributed(config: RunConfig, label: str, info: DeviceInfo,
                    emit: Callable[[object], None], cancelled: Callable[[], bool]) -> TrialResult:
    """Measure one precision under ``config.strategy`` with torchrun. Never raises."""
    started = time.time()
    reason = unsupported_reason(label, config.strategy) or _device_reason(config, info, label)
    if reason:
        return TrialResult(label, "unsupported", reason, started_s=started, finished_s=started)
    rec = dist_recipe(label, config.strategy)
    baselines = nvml_baselines(config, info)  # before any rank has loaded its model
    out_dir = Path(tempfile.mkdtemp(prefix="ampscope-dist-"))
    try:
        spec = {"config": config.to_dict(), "precision": label, "device_kind": info.kind}
        (out_dir / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
        follower = _Follower(out_dir)
        status, why = _follow(config, label, out_dir, follower, emit, cancelled)
        return _result(config, rec, info, label, follower, out_dir, status, started,
                       baselines, why)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def nvml_baselines(config: RunConfig, info: DeviceInfo) -> dict[int, int | None]:
    """Device-wide used memory of each local rank's GPU (rank i runs on cuda:i), read
    before torchrun starts. A rank reads its own baseline only after its model loaded,
    so in a container (where NVML lists host pids) its weights would fall out of its
    process memory; ``_rank_result`` subtracts this baseline instead."""
    if info.kind != "cuda":
        return {}
    from engine.measure.device import nvml_handle_of

    return {i: nvml.used_bytes(nvml_handle_of(i)) for i in range(config.nproc_per_node)}


def _rebased(sample: MonitorSample, baseline: int | None) -> MonitorSample:
    """A rank's monitor sample with its by-baseline process memory taken from the early
    baseline (by-pid readings are left as they are)."""
    if sample.process_mem_method != nvml.BASELINE_METHOD:
        return sample
    used = sample.gpu_mem_used_bytes
    if baseline is None or used is None:
        return dataclasses.replace(sample, process_mem_bytes=None, process_mem_method=(
            "n/a: no NVML process matched the rank and no baseline was read before the "
            "ranks loaded their models"))
    return dataclasses.replace(sample, process_mem_bytes=max(0, used - baseline),
                               process_mem_method=nvml.BASELINE_METHOD
                               + " (read before torchrun started the ranks)")


def _hook_text(hook: str | None, info: DeviceInfo) -> str | None:
    """Which DDP hook reduced the gradients: DDP accepts torch's bf16/fp16 compress hooks
    only under NCCL, so on gloo the same function runs registered under another name."""
    if hook is None:
        return None
    if info.kind == "cuda":
        return f"torch's {hook} (NCCL)"
    return (f"torch's {hook} arithmetic, registered as compress_hook_on_gloo (DDP accepts "
            f"the {hook} name only under NCCL)")


def _device_reason(config: RunConfig, info: DeviceInfo, label: str) -> str | None:
    # what the device cannot run alone it cannot run in ranks either (tf32 on a CPU is
    # fp32 arithmetic under another name: ranked apart, it would be a speed-up of noise)
    own = info.unsupported_reason(label.partition("@")[0])
    if own:
        return own
    if info.kind != "cuda":
        return None
    import torch

    have = torch.cuda.device_count()
    if have < config.nproc_per_node:
        return (f"{config.nproc_per_node} ranks per node need as many GPUs, this machine has "
                f"{have}: set --nproc-per-node {have} or less")
    return None


class _Stall:
    """Watches the ranks' step counts: the time since the slowest rank's last new step."""

    def __init__(self, timeout_s: float | None):
        self.timeout_s = timeout_s  # None: from the median step, once there is one
        self.counts: dict[int, int] = {}
        self.since = time.monotonic()

    def limit_s(self, follower: _Follower) -> float | None:
        times = [s.step_ms for r in follower.ranks.values() for s in r["steps"]]
        if not times:
            return None  # loading, compiling, the first step: NCCL's own timeout covers it
        if self.timeout_s is not None:
            return self.timeout_s
        return max(STALL_FLOOR_S, STALL_FACTOR * statistics.median(times) / 1e3)

    def stalled(self, follower: _Follower) -> str | None:
        """Why the trial is stalled (naming the rank), or None."""
        counts = {r: len(e["steps"]) for r, e in follower.ranks.items() if "result" not in e}
        if counts != self.counts:
            self.counts, self.since = counts, time.monotonic()
            return None
        limit = self.limit_s(follower)
        waited = time.monotonic() - self.since
        if not counts or limit is None or waited < limit:
            return None
        slowest = min(counts.values())
        behind = [r for r, n in sorted(counts.items()) if n == slowest]
        how = ("--stall-timeout" if self.timeout_s is not None
               else f"{STALL_FACTOR} median steps, at least {STALL_FLOOR_S:.0f} s")
        return (f"rank {', '.join(map(str, behind))} made no step for {waited:.0f} s after "
                f"step {slowest - 1} (limit {limit:.0f} s: {how}); the trial was ended. A rank "
                "that hangs is often waiting in a collective for a peer that died or diverged")


def _follow(config: RunConfig, label: str, out_dir: Path, follower: _Follower, emit,
            cancelled) -> tuple[str, str | None]:
    """Run torchrun to its end; returns ("ok" | "failed" | "cancelled" | "stalled", why)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    with open(out_dir / "torchrun.log", "wb") as log:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "engine.distributed.launch", str(out_dir)], cwd=ROOT, env=env,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    tree = _Tree(launcher.pid)
    emitted, deadline, stall, stalled = 0, None, _Stall(config.stall_timeout_s), None
    try:
        while True:
            done = launcher.poll() is not None
            tree.refresh()
            emitted = _emit_new(config, label, follower, emitted, emit)
            if done:
                break
            if stalled is None and deadline is None:
                stalled = stall.stalled(follower)
            if (cancelled() or stalled) and deadline is None:
                launcher.send_signal(signal.SIGTERM)  # torchrun's agent stops the ranks
                deadline = time.monotonic() + (STALL_GRACE_S if stalled else CANCEL_GRACE_S)
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
    finally:
        tree.kill()
        launcher.wait()
    if cancelled():
        return "cancelled", None
    if stalled:
        return "stalled", stalled
    return ("ok" if launcher.returncode == 0 else "failed"), None


class _Tree:
    """Every process ever seen below the launcher, so none is left when the trial ends."""

    def __init__(self, pid: int):
        self.root = psutil.Process(pid)
        self.seen: dict[int, psutil.Process] = {pid: self.root}

    def refresh(self) -> None:
        try:
            for child in self.root.children(recursive=True):
                self.seen.setdefault(child.pid, child)
        except psutil.Error:
            pass

    def kill(self) -> None:
        self.refresh()
        alive = []
        for proc in self.seen.values():
            try:
                proc.kill()  # psutil checks the pid still is this process (create time)
                alive.append(proc)
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=10)


def _emit_new(config: RunConfig, label: str, follower: _Follower, emitted: int, emit) -> int:
    """Forward new logs, and each step every local rank has finished, as one sample."""
    for _rank, kind, item in follower.poll():
        if kind == "failed":
            emit(LogEvent("error", item["reason"], label, time.time()))
    ranks = follower.ranks
    if len(ranks) < config.nproc_per_node:
        return emitted
    while all(len(r["steps"]) > emitted for r in ranks.values()):
        emit(_combined([r["steps"][emitted] for r in ranks.values()], config, ranks))
        emitted += 1
    return emitted


def _world(ranks: dict) -> int:
    return next((r["start"]["world_size"] for r in ranks.values() if "start" in r), len(ranks))


def _combined(samples: list[StepSample], config: RunConfig, ranks: dict) -> StepSample:
    """One step of the trial from the ranks seen here. A rank's loss is over its own rows
    (equal shares): their mean is the global batch's loss when every rank is local, and
    unknown until the ranks' closing all-reduce otherwise (``_with_global``)."""
    slowest = max(samples, key=lambda s: s.step_ms)
    world = _world(ranks)
    tokens = config.tokens_per_step * world
    losses = [s.loss for s in samples]
    loss = (sum(losses) / world if len(samples) == world and None not in losses else None)
    allocated = [s.allocated_bytes for s in samples if s.allocated_bytes is not None]
    reserved = [s.reserved_bytes for s in samples if s.reserved_bytes is not None]
    return StepSample(
        precision=slowest.precision, step=slowest.step, warmup=slowest.warmup,
        loss=loss, step_ms=slowest.step_ms,
        tokens_per_s=tokens / (slowest.step_ms / 1e3) if slowest.step_ms > 0 else 0.0,
        tflops=None, mfu=None, allocated_bytes=max(allocated) if allocated else None,
        reserved_bytes=max(reserved) if reserved else None, loss_scale=samples[0].loss_scale,
        skipped=any(s.skipped for s in samples), grad_norm=samples[0].grad_norm,
        time_s=slowest.time_s)


def _with_global(steps: list[StepSample], result: dict) -> list[StepSample]:
    """Steps with the global loss and gradient norm the ranks all-reduced after their
    timed steps (a rank that ended early sent none: the steps stay as followed)."""
    losses, norms = result.get("global_loss"), result.get("global_grad_norm")
    if not losses or len(losses) != len(steps):
        return steps
    return [replace(s, loss=loss, grad_norm=norm) for s, loss, norm in zip(steps, losses, norms)]


def _last_words(log: Path) -> str | None:
    """The last error line the ranks printed (a C++ abort says why only there)."""
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for marks in (("what():", "terminate called"), ("Error", "error:", "Exception")):
        said = [ln.strip() for ln in lines if any(m in ln for m in marks)
                and "torch.distributed.elastic" not in ln]
        if said:
            return said[-1][:400]
    return None


def _failure(out_dir: Path, ranks: dict) -> tuple[int | None, str, str]:
    """(failed rank, status, reason): torchrun's first failure, in that rank's own words
    where it wrote them (the others often fail after it, on a broken collective)."""
    path = out_dir / "failure.json"
    fail = json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
    own = [r for r in sorted(ranks) if "failed" in ranks[r]]
    rank = fail["rank"] if fail else (own[0] if own else None)
    if rank is not None and "failed" in ranks.get(rank, {}):
        return rank, ranks[rank]["failed"]["status"], ranks[rank]["failed"]["reason"]
    if fail:
        code = fail["exitcode"]
        if code == -signal.SIGKILL:
            return rank, "oom", (f"rank {rank} was killed (SIGKILL), most likely by the system's "
                                 "out-of-memory killer; torchrun stopped the other ranks")
        said = _last_words(out_dir / "torchrun.log")
        return rank, "error", (f"rank {rank} exited with code {code} ({fail['message']}); "
                               "torchrun stopped the other ranks"
                               + (f"; its log ends: {said}" if said else ""))
    log = (out_dir / "torchrun.log").read_text(encoding="utf-8", errors="replace")
    tail = " | ".join(log.strip().splitlines()[-3:])
    stepped = max((len(e["steps"]) for e in ranks.values()), default=0)
    if stepped:  # the launcher itself was ended (killed from outside, or it crashed)
        return None, "error", (f"torchrun's launcher ended after the ranks had reported "
                               f"{stepped} steps, without naming a failed rank: "
                               f"{tail or 'no output'}")
    return None, "error", f"torchrun ended before any rank reported: {tail or 'no output'}"


def _rank_result(rank: int, entry: dict, status: str, reason: str | None,
                 baselines: dict[int, int | None]) -> RankResult:
    start, res = entry.get("start", {}), entry.get("result")
    if res is None:
        return RankResult(rank, start.get("local_rank", -1), start.get("host", ""),
                          start.get("pid", 0), status, reason, steps=entry["steps"])
    return RankResult(
        rank=rank, local_rank=start["local_rank"], host=start["host"], pid=start["pid"],
        status="ok", steps=entry["steps"], memory=from_dict(RankMemory, res["memory"]),
        predicted_memory=from_dict(RankMemory, res["predicted_memory"]),
        memory_error_pct=res["memory_error_pct"],
        monitor_samples=[_rebased(from_dict(MonitorSample, m),
                                  baselines.get(start["local_rank"]))
                         for m in res["monitor_samples"]],
        comm=[from_dict(CommVolume, c) for c in res["comm"]],
        median_step_ms=res["median_step_ms"], tokens_per_s=res["tokens_per_s"])


def _result(config: RunConfig, rec, info: DeviceInfo, label: str, follower: _Follower,
            out_dir: Path, status: str, started: float,
            baselines: dict[int, int | None], why: str | None = None) -> TrialResult:
    ranks = follower.ranks
    failed_rank, reason = None, None
    if status == "stalled":
        status, reason = "error", why
        failed_rank = min((r for r, e in ranks.items() if "result" not in e),
                          key=lambda r: len(ranks[r]["steps"]), default=None)
    elif status == "failed":
        failed_rank, status, reason = _failure(out_dir, ranks)
    elif status == "cancelled":
        reason = "stopped by the user; torchrun and its ranks were ended"
    elif any("result" not in r for r in ranks.values()) or len(ranks) < config.nproc_per_node:
        status, reason = "error", "a rank ended without reporting its result"
    rank_results = []
    for rank in sorted(ranks):
        own = reason if rank == failed_rank else None
        rank_status = status if rank == failed_rank else (
            "ok" if status == "ok" else "stopped")
        rank_results.append(_rank_result(rank, ranks[rank], rank_status, own, baselines))
    world = _world(ranks) if ranks else config.nproc_per_node
    first = ranks[min(ranks)].get("result", {}) if ranks else {}
    steps = _with_global([_combined([r["steps"][i] for r in ranks.values()], config, ranks)
                          for i in range(min((len(r["steps"]) for r in ranks.values()),
                                             default=0))], first)
    done = [r for r in rank_results if r.memory is not None]
    biggest = max(done, key=lambda r: r.memory.total_bytes, default=None)
    medians = [(r.median_step_ms, r.rank) for r in done if r.median_step_ms]
    tokens = config.tokens_per_step * world
    slow, fast = (max(medians), min(medians)) if medians else ((None, None), (None, None))
    summary = DistributedSummary(
        strategy=config.strategy, world_size=world, nproc_per_node=config.nproc_per_node,
        backend="nccl" if info.kind == "cuda" else "gloo", sharded=rec.sharded,
        collectives=rec.collectives, slowest_rank=slow[1], slowest_step_ms=slow[0],
        fastest_step_ms=fast[0],
        step_spread_pct=100 * (slow[0] - fast[0]) / fast[0] if medians else None,
        max_memory_bytes=biggest.memory.total_bytes if biggest else None,
        min_memory_bytes=min(r.memory.total_bytes for r in done) if done else None,
        total_tokens_per_s=tokens / (slow[0] / 1e3) if medians else None,
        comm=done[0].comm if done else [],
        comm_method="payload bytes (largest buffer) of each c10d op dispatched in one "
                    "extra untimed step before the timed ones (its counting mode would slow "
                    "a timed step), counted by a TorchDispatchMode; expected: "
                    + first.get("comm_formula", "n/a"),
        comm_time_reason="not measured: collectives overlap backward, and the dispatch "
                         "count sees their launch, not their completion",
        failed_rank=failed_rank, comm_hook=_hook_text(rec.hook, info))
    verdict = info.verdict(rec.base.precision)
    return TrialResult(
        precision=label, status=status, reason=reason, recipe=rec.description,
        device=f"{world} x {info.describe()}" if info.kind == "cuda" else
        f"{world} ranks on {info.describe()}",
        param_count=first.get("param_count", 0), trainable_params=first.get("trainable_params", 0),
        memory=_breakdown(biggest), predicted_memory=_predicted(biggest), steps=steps,
        summary=_summary(steps, biggest, tokens) if steps or status == "ok" else None,
        started_s=started, finished_s=time.time(), ranks=rank_results, distributed=summary,
        # the device's gating verdict for the recipe the ranks train in (emulated fp8 on CPUs)
        support=verdict.support if verdict else None,
        support_reason=verdict.reason if verdict else None)


def _breakdown(r: RankResult | None) -> MemoryBreakdown | None:
    """The rank with the most memory, in the single-process categories."""
    if r is None:
        return None
    m = r.memory
    return MemoryBreakdown(
        params_bytes=m.sharded_params_bytes, grads_bytes=m.grads_bytes,
        optimizer_bytes=m.optimizer_bytes, activations_bytes=m.activations_bytes,
        activations_method="bytes autograd saved for backward in one micro-batch on this rank, "
                           "parameters excluded (saved-tensor hooks)",
        peak_allocated_bytes=m.peak_allocated_bytes, total_bytes=m.total_bytes,
        total_method=f"rank {r.rank} (the most memory): {m.total_method}", notes=m.notes)


def _predicted(r: RankResult | None) -> PredictedMemory | None:
    if r is None or r.predicted_memory is None:
        return None
    p = r.predicted_memory
    errors = {k.removeprefix("sharded_"): v for k, v in r.memory_error_pct.items()}
    return PredictedMemory(
        params_bytes=p.sharded_params_bytes, master_bytes=0, grads_bytes=p.grads_bytes,
        optimizer_bytes=p.optimizer_bytes, activations_bytes=p.activations_bytes or 0,
        total_bytes=p.total_bytes, formula=p.notes, error_pct=errors)


def _summary(steps: list[StepSample], biggest: RankResult | None, tokens: int) -> TrialSummary:
    measured = [s for s in steps if not s.warmup]
    median = statistics.median(s.step_ms for s in measured) if measured else None
    last = steps[-1] if steps else None
    return TrialSummary(
        steps_measured=len(measured), median_step_ms=median,
        tokens_per_s=tokens / (median / 1e3) if median else None, tflops=None, mfu=None,
        mfu_reason="FLOPs are not counted in distributed trials", peak_flops=None,
        mfu_measured_reason="FLOPs are not counted in distributed trials",
        peak_flops_source=None,
        peak_memory_bytes=biggest.memory.total_bytes if biggest else None,
        peak_memory_method=(f"the rank with the most memory (rank {biggest.rank})"
                            if biggest else "not measured"),
        skipped_steps=sum(1 for s in measured if s.skipped),
        final_loss=last.loss if last else None,
        final_loss_scale=last.loss_scale if last else None)
