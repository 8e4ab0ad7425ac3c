"""Figures a GPU run would get wrong, checked where they are produced, on the CPU.

Each test feeds the call site (the trial, the Recorder, fit) what real hardware returns
and checks the figure against a computation of its own.
"""

import contextlib
import dataclasses
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import engine.run.trial as trial_mod
from engine.core.config import RunConfig
from engine.measure import gating, nvml
from engine.measure.device import DeviceInfo, probe
from engine.models.load import load_model
from engine.run import trial_steps
from engine.run.trial import run_trial

ROOT = Path(__file__).resolve().parents[2]
CPU = probe("cpu")


def _config(**kw):
    base = dict(model="tiny", batch_size=2, seq_len=32, steps=2, warmup=0, device="cpu",
                isolation="inline", profile_step=False)
    base.update(kw)
    return RunConfig(**base)


# --- fp8 FLOPs are filed under fp8 -----------------------------------------------------


def test_an_fp8_trial_files_its_float8_matmuls_under_fp8():
    from torchao.float8.float8_linear import Float8Linear

    config = _config(batch_size=1, seq_len=16, steps=1)
    # a device with fp8 hardware, as the gating matrix would judge an H100 (not emulated)
    fp8_device = dataclasses.replace(CPU, unsupported={}, fp8_supported=True, verdicts={
        "fp8": gating.Verdict("native", "fp8 Tensor Cores")})
    result = run_trial(config, "fp8", fp8_device, lambda e: None, lambda: False)
    assert result.status == "ok", result.reason
    # every converted Linear multiplies in float8 three times per step (forward, input
    # gradient, weight gradient): 2 FLOPs per weight and token each
    model = load_model("tiny", "fp8", "cpu", 0).model
    fp8_weights = sum(m.in_features * m.out_features for m in model.modules()
                      if isinstance(m, Float8Linear))
    assert fp8_weights > 0
    by_dtype = result.flops.by_peak_dtype
    assert by_dtype.get("fp8") == 6 * config.tokens_per_step * fp8_weights
    assert sum(by_dtype.values()) == result.flops.counted_per_step


# --- a MIG slice is divided by its own share of the GPU's peak --------------------------

# what torch.cuda.get_device_properties returns inside an H100 SXM MIG 1g.10gb instance:
# CUDA names the slice after its profile and counts only its SMs (16 of the GPU's 132)
H100_MIG_1G = SimpleNamespace(name="NVIDIA H100 80GB HBM3 MIG 1g.10gb", major=9, minor=0,
                              total_memory=10 * 10**9, multi_processor_count=16,
                              uuid="MIG-5f3c0e7e-0000-5000-8000-000000000001",
                              pci_domain_id=0, pci_bus_id=0x19, pci_device_id=0)


def _table_row(name: str) -> dict:
    rows = json.loads((ROOT / "resources" / "peak_flops.json").read_text(encoding="utf-8"))
    return next(g for g in rows["gpus"] if g["name"] == name)


@pytest.fixture
def mig_slice(monkeypatch):
    """The DeviceInfo engine.measure.device.probe builds inside a 1g slice (NVML saying it is a MIG
    handle), then run on the CPU: its torch device is the CPU, its drains are recorded."""
    with monkeypatch.context() as m:
        m.setattr(torch.cuda, "is_available", lambda: True)
        m.setattr(torch.cuda, "device_count", lambda: 1)
        m.setattr(torch.cuda, "get_device_properties", lambda i: H100_MIG_1G)
        m.setattr(nvml, "handle_for", lambda uuid, bus=None: "mig-handle")
        m.setattr(nvml, "device_static", lambda h: {"driver_version": "580.65.06"})
        m.setattr(nvml, "query", lambda fn, *a: 1 if fn == "nvmlDeviceIsMigDeviceHandle"
                  else None)
        info = probe("cuda:0")
    assert info.mig and info.sm_count == 16
    syncs = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(device))
    monkeypatch.setattr(DeviceInfo, "torch_device", property(lambda self: torch.device("cpu")))
    monkeypatch.setattr(DeviceInfo, "device_context", lambda self: contextlib.nullcontext())
    return info, syncs


def _slice_peak(by_dtype: dict) -> float:
    """The blended peak of an H100 SXM's 1g slice: 16/132 of each dtype's datasheet peak."""
    row = _table_row("NVIDIA H100 SXM5")
    share = 16 / row["sm_count"]
    seconds = sum(f / (row["peak_tflops"][d] * 1e12 * share) for d, f in by_dtype.items())
    return sum(by_dtype.values()) / seconds


def test_a_trial_on_a_mig_slice_divides_by_the_slice_s_peak(mig_slice):
    info, _ = mig_slice
    result = run_trial(_config(steps=2, warmup=1), "bf16-amp", info, lambda e: None,
                       lambda: False)
    assert result.status == "ok", result.reason
    summary = result.summary
    peak = _slice_peak(result.flops.by_peak_dtype)
    assert summary.peak_flops == pytest.approx(peak, rel=1e-9)
    seconds = summary.median_step_ms / 1e3
    assert summary.mfu == pytest.approx(result.flops.analytic_per_step / seconds / peak)
    for s in result.steps:
        assert s.mfu == pytest.approx(result.flops.analytic_per_step / (s.step_ms / 1e3) / peak)


def test_the_recorder_on_a_mig_slice_divides_by_the_slice_s_peak(mig_slice, monkeypatch,
                                                                 tmp_path):
    import ampscope
    import ampscope.recorder as recorder_mod

    info, _ = mig_slice
    monkeypatch.setattr(recorder_mod, "probe", lambda requested: info)
    model = load_model("tiny", "fp32", "cpu", 0).model
    batch = {"input_ids": torch.randint(0, 64, (2, 16))}
    batch["labels"] = batch["input_ids"]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with ampscope.Recorder(model, opt, precision="fp32",
                           journal=tmp_path / "run.jsonl") as rec:
        for _ in range(3):
            model(**batch).loss.backward()
            opt.step()
            opt.zero_grad()
            rec.step()
    (trial,) = rec.record.trials
    peak = _slice_peak({"fp32": 1})
    assert trial.summary.peak_flops == pytest.approx(peak, rel=1e-9)
    assert trial.summary.mfu == pytest.approx(trial.summary.tflops * 1e12 / peak)
    for s in trial.steps:
        assert s.mfu == pytest.approx(s.tflops * 1e12 / peak)


# --- NVML windows open and close on a drained GPU --------------------------------------


def test_the_gpm_window_opens_after_the_warmup_drained_and_closes_after_the_last_step(
        mig_slice, monkeypatch):
    info, _ = mig_slice
    calls = []
    real_step = trial_steps.step

    def step(*args):
        calls.append(f"step {args[-1]}")
        return real_step(*args)

    monkeypatch.setattr(trial_steps, "step", step)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("drain"))
    monkeypatch.setattr(trial_mod.GpmWindow, "start", lambda self: calls.append("gpm start"))
    real_stop = trial_mod.GpmWindow.stop
    monkeypatch.setattr(trial_mod.GpmWindow, "stop",
                        lambda self: calls.append("gpm stop") or real_stop(self))
    result = run_trial(_config(steps=2, warmup=1), "fp32", info, lambda e: None, lambda: False)
    assert result.status == "ok", result.reason
    assert calls == ["step 0", "drain", "gpm start", "step 1", "step 2", "drain", "gpm stop"]


def test_the_distributed_nvml_baseline_is_read_before_the_ranks_load_their_models(
        monkeypatch):
    """In a container NVML lists host pids, so a rank's process memory is the GPU's used
    memory minus a baseline; a baseline read after the model loaded leaves the model out."""
    import engine.distributed.trial as dtrial
    import engine.measure.device
    from engine.core.events import MonitorSample, RankMemory, to_dict

    gpu = {"used": 1_500_000_000}  # another tenant and the driver, before our ranks start
    calls = []

    def used_bytes(handle):
        calls.append(f"baseline {handle}")
        return gpu["used"]

    def fake_torchrun(config, label, out_dir, follower, emit, cancelled):
        calls.append("torchrun")
        late_baseline = gpu["used"] + 1_000_000_000  # the rank's weights and CUDA context
        used = late_baseline + 1_500_000_000  # then its steps' activations, gradients...
        memory = to_dict(RankMemory(10, None, 10, 20, 5, None, total_bytes=45))
        sample = to_dict(MonitorSample(
            time_s=1.0, source="nvml", gpu_mem_used_bytes=used,
            process_mem_bytes=used - late_baseline, process_mem_method=nvml.BASELINE_METHOD))
        lines = [
            {"type": "start", "rank": 0, "local_rank": 0, "world_size": 1, "host": "h",
             "pid": 4242},
            {"type": "result", "memory": memory, "predicted_memory": memory,
             "memory_error_pct": {}, "comm": [], "comm_formula": "", "median_step_ms": None,
             "monitor_samples": [sample], "tokens_per_s": None, "param_count": 10,
             "trainable_params": 10},
        ]
        (out_dir / "rank0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines),
                                             encoding="utf-8")
        follower.poll()
        return "ok"

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(engine.measure.device, "nvml_handle_of", lambda index: f"cuda:{index}")
    monkeypatch.setattr(nvml, "used_bytes", used_bytes)
    monkeypatch.setattr(dtrial, "_follow", fake_torchrun)
    info = dataclasses.replace(CPU, kind="cuda", index=0, name="NVIDIA H100 80GB HBM3")
    result = dtrial.run_distributed(_config(strategy="ddp", nproc_per_node=1,
                                            isolation="process"), "bf16-amp",
                                    info, lambda e: None, lambda: False)
    assert calls == ["baseline cuda:0", "torchrun"]
    (sample,) = result.ranks[0].monitor_samples
    assert sample.process_mem_bytes == 1_000_000_000 + 1_500_000_000
    assert "before torchrun started the ranks" in sample.process_mem_method


# --- fit ---------------------------------------------------------------------------------


def _eager_steps_run_out_of_memory(monkeypatch):
    """The two eager steps of a trial (FLOP counting, watching memory by category) raise
    what the CUDA caching allocator raises when they do not fit."""
    from engine.measure import flops as flops_mod
    from engine.measure import memtrack

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
                                     "has a total capacity of 79.19 GiB")

    monkeypatch.setattr(flops_mod, "count_flops", oom)
    monkeypatch.setattr(memtrack.MemoryWatcher, "__enter__", oom)


def test_fit_does_not_read_an_eager_step_s_oom_as_a_compiled_probe_s(monkeypatch):
    from engine.run.fit import FitConfig, fit_precision

    _eager_steps_run_out_of_memory(monkeypatch)
    compiled = []  # compiling float8 for real takes minutes on the CPU
    monkeypatch.setattr(torch, "compile", lambda model: compiled.append(model) or model)
    # a device with fp8 hardware, as the gating matrix would judge an H100 (not emulated)
    fp8_device = dataclasses.replace(CPU, unsupported={}, fp8_supported=True, verdicts={
        "fp8": gating.Verdict("native", "fp8 Tensor Cores")})
    config = FitConfig(model="tiny", precisions=("fp8",), seq_len=16, max_batch=2,
                       memory_budget_bytes=8 * 2**30, device="cpu", isolation="inline")
    result = fit_precision(config, "fp8", fp8_device, config.memory_budget_bytes)
    assert len(compiled) == 2  # both probes ran compiled
    assert [(p.batch_size, p.status, p.fits) for p in result.probes] == [(1, "ok", True),
                                                                        (2, "ok", True)]
    assert result.batch_size == 2 and all(p.peak_bytes for p in result.probes)


def test_fit_still_reads_an_eager_probe_s_oom_as_not_fitting(monkeypatch):
    from engine.run.fit import FitConfig, fit_precision

    _eager_steps_run_out_of_memory(monkeypatch)
    config = FitConfig(model="tiny", precisions=("fp32",), seq_len=16, max_batch=2,
                       memory_budget_bytes=8 * 2**30, device="cpu", isolation="inline")
    result = fit_precision(config, "fp32", CPU, config.memory_budget_bytes)
    assert [(p.batch_size, p.status, p.fits) for p in result.probes] == [(1, "oom", False)]
    assert result.batch_size is None


def test_fit_cards_are_sized_as_cuda_reports_them_in_gib():
    from engine.run.fit import CARDS, FitProbe, FitResult, format_fit, linear_fit

    h100 = next(c for c in CARDS if c.label == "H100 80GB")
    # the figure: an "80 GB" H100 SXM reports about 85.0e9 bytes, 79.2 GiB
    assert abs(h100.capacity_bytes - 85.0e9) < 0.05e9 and h100.capacity_bytes < 80 * 2**30
    probes = [FitProbe(b, True, "ok", None, (300 + 100 * b) * 2**20, "m", 1.0, None)
              for b in (1, 2)]
    slope, fixed, line, cards = linear_fit(probes)
    result = FitResult("fp32", 2**30, 2, None, 500 * 2**20, "m", 1.0, None, probes, slope,
                       fixed, line, cards, "note")
    text = format_fit(2**30, [result])
    assert "H100 80GB (79.2 GiB)" in text and "GiB = 2^30 bytes" in text
    row = [ln for ln in text.splitlines() if ln.startswith("fp32 ")][1]
    # (capacity - 300 MiB fixed) / 100 MiB per sample, from the card's reported bytes
    assert row.split()[1:] == [str((c.capacity_bytes - 300 * 2**20) // (100 * 2**20))
                               for c in CARDS]


def _h100_with_context(monkeypatch, context_bytes: int | None):
    """An H100 whose NVML shows this process holding ``context_bytes`` more than torch's
    allocator reserved (None: NVML lists no process of ours, as in a container)."""
    reserved = 2 * 2**20  # the block the one-element tensor lives in
    info = dataclasses.replace(CPU, kind="cuda", index=0, name="NVIDIA H100 80GB HBM3",
                               total_memory_bytes=81090 * 2**20, unsupported={})
    monkeypatch.setattr(DeviceInfo, "torch_device", property(lambda self: torch.device("cpu")))
    monkeypatch.setattr(DeviceInfo, "device_context", lambda self: contextlib.nullcontext())
    monkeypatch.setattr(DeviceInfo, "nvml_handle", lambda self: "h100")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: reserved)
    procs = [] if context_bytes is None else [
        SimpleNamespace(pid=os.getpid(), usedGpuMemory=reserved + context_bytes)]
    monkeypatch.setattr(nvml, "query", lambda fn, *a: procs
                        if fn == "nvmlDeviceGetComputeRunningProcesses" else None)
    fractions = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, index=None: fractions.append(fraction))
    return info, fractions


@pytest.mark.parametrize("context_mib", [None, 520])
def test_fit_takes_the_cuda_context_off_the_allocator_s_budget(monkeypatch, context_mib):
    from engine.run.fit import FitConfig, cuda_context, fit_precision, format_fit

    context = None if context_mib is None else context_mib * 2**20
    info, fractions = _h100_with_context(monkeypatch, context)
    budget = 24 * 2**30
    config = FitConfig(model="tiny", precisions=("fp32",), seq_len=16, max_batch=1,
                       memory_budget_bytes=budget, device="cpu", isolation="inline")
    measured = cuda_context(info)
    assert measured[0] == context
    result = fit_precision(config, "fp32", info, budget, context=measured)
    allocator = budget - (context or 0)
    assert fractions[0] == pytest.approx(allocator / (81090 * 2**20))
    text = format_fit(budget, [result])
    if context is None:
        assert "CUDA context not taken off the budget: not measured: NVML lists no process" \
            in text
    else:
        assert f"CUDA context {context_mib}.0 MiB taken off the budget" in text
        assert f"the allocator gets {allocator / 2**20:.1f} MiB" in text


# --- scripts/gpu_acceptance.py judges what it measured -----------------------------------


def _acceptance():
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("gpu_acceptance",
                                                  ROOT / "scripts" / "gpu_acceptance.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module



def test_acceptance_fp8_share_of_a_real_cpu_fp8_trial():
    acc = _acceptance()
    config = _config(batch_size=1, seq_len=16, steps=1)
    # a device with fp8 hardware, as the gating matrix would judge an H100 (not emulated)
    fp8_device = dataclasses.replace(CPU, unsupported={}, fp8_supported=True, verdicts={
        "fp8": gating.Verdict("native", "fp8 Tensor Cores")})
    trial = run_trial(config, "fp8", fp8_device, lambda e: None, lambda: False)
    check = acc.fp8_share_check(trial, config.tokens_per_step)
    # weights and biases of the converted layers, counted here from the model itself
    from torchao.float8.float8_linear import Float8Linear

    model = load_model("tiny", "fp8", "cpu", 0).model
    weights = sum(p.numel() for m in model.modules() if isinstance(m, Float8Linear)
                  for p in m.parameters())
    expected = trial.flops.by_peak_dtype["fp8"] / (6 * config.tokens_per_step * weights)
    assert check.passed is (expected >= acc.FP8_MIN) and check.measured.startswith(
        f"{expected:.3f}")
    # the same trial with its float8 matmuls filed under bf16 (the bug) fails the check
    flops = dataclasses.replace(trial.flops, by_peak_dtype={
        "bf16": sum(trial.flops.by_peak_dtype.values())})
    assert acc.fp8_share_check(dataclasses.replace(trial, flops=flops),
                               config.tokens_per_step).passed is False



@pytest.mark.parametrize(("isolation", "where"), [("process", "child"), ("inline", "here")])
def test_fit_measures_the_context_where_its_probes_run(monkeypatch, isolation, where):
    """A context made in the parent would stay on the GPU through every probe child."""
    import engine.run.fit as fit_mod
    import engine.run.runner

    info = dataclasses.replace(CPU, kind="cuda", index=0, name="NVIDIA H100 80GB HBM3",
                               total_memory_bytes=81090 * 2**20, unsupported={})
    monkeypatch.setattr(engine.run.runner, "preflight", lambda config: info)
    monkeypatch.setattr(fit_mod, "cuda_context", lambda i: (1, "here"))
    monkeypatch.setattr(fit_mod, "_context_in_child", lambda i: (2, "child"))
    seen = []
    monkeypatch.setattr(fit_mod, "fit_precision",
                        lambda config, p, i, budget, on_probe, cancelled, context:
                        seen.append(context))
    fit_mod.run_fit(fit_mod.FitConfig(model="tiny", precisions=("fp32",), device="cpu",
                                      memory_budget_bytes=2**30, isolation=isolation))
    assert [method for _, method in seen] == [where]


def test_the_context_measuring_process_answers():
    from engine.run.fit import _context_in_child

    assert _context_in_child(CPU) == (None, "no CUDA context on the CPU")
