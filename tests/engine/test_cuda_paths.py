"""The CUDA code paths' logic, exercised on the CPU with fake NVML, event and device objects.

What only a GPU can answer is in ``test_gpu.py``.
"""

import dataclasses
import math
import re
import statistics
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import engine.run.trial as trial_mod
from engine.core.config import RunConfig
from engine.core.recipes import (
    RECIPES,
    fp8_shape_reason,
    fp32_precision,
    library_sync_notes,
    run_description,
)
from engine.measure import gating, memtrack, nvml
from engine.measure.device import DeviceInfo, probe
from engine.measure.monitor import Monitor
from engine.measure.trackers import AllocatorTracker, NvmlTracker, ScalarReadback, StepTimer
from engine.models.load import load_model, make_batches
from engine.models.optimizers import make_optimizer
from engine.run import trial_setup, trial_steps, trial_untimed
from engine.run.runner import Runner
from engine.run.trial import run_trial
from engine.run.trial_state import TrialState

ROOT = Path(__file__).resolve().parents[2]
CPU = probe("cpu")


def _config(**kw):
    base = dict(model="tiny", batch_size=2, seq_len=32, steps=3, warmup=1, device="cpu",
                isolation="inline")
    base.update(kw)
    return RunConfig(**base)


# --- NVML: the torch device found by UUID, not by index ------------------------------


class FakeNvml:
    """pynvml's surface for three GPUs; the process list reports host pids on request."""

    def __init__(self, used=(1000, 2000, 3000), procs=None):
        self.uuids = ["GPU-aaaa", "GPU-bbbb", "MIG-cccc"]
        self.used = list(used)
        self.procs = procs or {}
        self.energy_mj = 0

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.uuids:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return self.uuids.index(uuid)

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        if bus != "00000000:41:00.0":
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return 1

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=self.used[h], total=80 * 2**30)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=pid, usedGpuMemory=b) for pid, b in self.procs.get(h, [])]

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return self.energy_mj

    def nvmlDeviceGetName(self, h):
        return ["GPU A", "GPU B", "GPU C MIG 1g.10gb"][h]


@pytest.fixture
def fake_nvml(monkeypatch):
    fake = FakeNvml()
    monkeypatch.setattr(nvml, "_state", {"tried": True, "ok": True, "error": None, "lib": fake})
    return fake


def test_a_gpu_is_found_by_its_uuid_whatever_torch_numbers_it(fake_nvml):
    # CUDA_VISIBLE_DEVICES=1 makes NVML's GPU 1 torch's cuda:0; torch prints the bare uuid
    assert nvml.handle_for("bbbb") == 1
    assert nvml.handle_for("cccc") == 2  # a MIG slice answers to MIG-<uuid>
    assert nvml.handle_for("zzzz", "00000000:41:00.0") == 1  # PCI bus id as the fallback
    assert nvml.handle_for("zzzz", "00000000:01:00.0") is None
    info = dataclasses.replace(CPU, kind="cuda", index=0, uuid="bbbb")
    assert info.nvml_handle() == 1
    assert nvml.device_static(info.nvml_handle())["name"] == "GPU B"


def test_probe_of_cuda_1_names_the_gpu_nvml_knows_and_its_sm_count(fake_nvml, monkeypatch):
    props = SimpleNamespace(name="NVIDIA A100-SXM4-80GB MIG 1g.10gb", major=8, minor=0,
                            total_memory=10 * 2**30, multi_processor_count=14, uuid="cccc",
                            pci_domain_id=0, pci_bus_id=0x41, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    fake_nvml.nvmlSystemGetDriverVersion = lambda: "580.1"
    fake_nvml.nvmlDeviceIsMigDeviceHandle = lambda h: 1
    info = probe("cuda:1")
    assert (info.kind, info.index, info.torch_device) == ("cuda", 1, torch.device("cuda", 1))
    assert info.uuid == "cccc" and info.pci_bus_id == "00000000:41:00.0"
    assert info.nvml_handle() == 2 and info.driver_version == "580.1"
    assert info.sm_count == 14 and info.mig
    assert "instantaneous" in info.power_method  # GA100


def test_process_memory_by_pid_then_device_wide_minus_the_baseline(fake_nvml):
    fake_nvml.procs = {1: [(111, 500), (222, 700), (999, 4000)]}
    assert nvml.process_memory(1, {111, 222}, 100) == (1200, nvml.PID_METHOD)
    # in a container NVML lists host pids: none matches ours
    fake_nvml.used[1] = 2000 + 1500
    got, method = nvml.process_memory(1, {5}, 2000)
    assert got == 1500 and method == nvml.BASELINE_METHOD and "baseline" in method
    got, method = nvml.process_memory(1, {5}, None)
    assert got is None and "no baseline" in method


def test_the_monitor_watches_the_uuid_gpu_and_reads_the_baseline_when_a_child_starts(
        fake_nvml):
    info = dataclasses.replace(CPU, kind="cuda", index=0, uuid="bbbb", nvml_available=True)
    samples = []
    monitor = Monitor.for_device(info, samples.append)
    assert isinstance(monitor.tracker, NvmlTracker) and monitor.tracker.handle == 1
    fake_nvml.used[1] = 2500
    monitor.watch_pid(4242)  # the trial child, before it touched the GPU
    fake_nvml.used[1] = 2500 + 800
    fields = monitor.tracker.sample()
    assert fields["process_mem_bytes"] == 800
    assert fields["process_mem_method"] == nvml.BASELINE_METHOD
    assert fields["gpu_mem_used_bytes"] == 3300


def test_power_reading_says_what_it_averages():
    assert "1 s average" in nvml.power_method((9, 0))
    assert "1 s average" in nvml.power_method((8, 6))
    assert "instantaneous" in nvml.power_method((8, 0))  # GA100 reads instantly


# --- timing ---------------------------------------------------------------------------


class FakeEvent:
    log: list = []

    def __init__(self, enable_timing=False):
        self.stream = None

    def record(self, stream=None):
        self.stream = stream
        FakeEvent.log.append(("record", stream))

    def synchronize(self):
        FakeEvent.log.append(("sync", self))


@pytest.fixture
def fake_cuda_events(monkeypatch):
    FakeEvent.log = []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: f"stream:{device}")
    return FakeEvent.log


def test_step_events_are_recorded_on_the_trial_gpus_stream(fake_cuda_events):
    timer = StepTimer(torch.device("cuda", 1))
    timer.start()
    mark = timer.stop()
    assert mark.start.stream == mark.end.stream == "stream:cuda:1"


def test_readback_copies_to_host_memory_and_waits_for_that_copy_only(fake_cuda_events):
    rb = ScalarReadback(torch.device("cpu"), width=4)
    rb.cuda, rb.device = True, torch.device("cpu")  # the CUDA path, on CPU tensors
    rb._host = torch.zeros((rb.slots, 4), dtype=torch.float64)
    first = rb.push([torch.tensor(2.5), torch.tensor(0.75), None, torch.tensor(1024.0)])
    second = rb.push([torch.tensor(3.5), torch.tensor(0.5), None, None])
    assert first.slot != second.slot  # the pending step's row is not overwritten
    assert rb.read(first) == [2.5, 0.75, None, 1024.0]
    assert fake_cuda_events[-1] == ("sync", first.done)  # its own event, not the stream
    assert rb.read(second) == [3.5, 0.5, None, None]


def test_readback_on_the_cpu_reads_the_values():
    rb = ScalarReadback(torch.device("cpu"), width=2)
    assert rb.read(rb.push([torch.tensor(1.5), None])) == [1.5, None]


def test_allocator_peaks_say_which_steps_they_cover(monkeypatch):
    readings = iter([(900, 1000), (500, 600), (700, 800)])
    current = {}

    def max_alloc(device):
        current["now"] = next(readings)
        return current["now"][0]

    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", max_alloc)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: current["now"][1])
    alloc = AllocatorTracker(torch.device("cuda", 0))
    for measured in (False, True, True):
        alloc.start()
        alloc.sample(measured=measured)
    allocated, reserved, covers = alloc.stop()
    assert (allocated, reserved) == (700, 800)  # the 900 of the warm-up step is left out
    assert "2 measured steps" in covers and "1 warm-up step and" in covers


def test_memory_reads_nvml_and_reserved_at_the_same_moment(monkeypatch):
    class Alloc:
        def stop(self):
            return 10_000, 12_000, "over the 3 measured steps"

        def reserved_now(self):
            return 8_000

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(nvml, "process_memory", lambda h, pids, base: (9_500, "by pid"))
    categories = ("params", "buffers", "quant_state", "grads", "optimizer", "inputs",
                  "weight_copies", "activations", "temporaries")
    measured = memtrack.MeasuredPeak(peak_bytes=7_000, at_peak=dict.fromkeys(categories, 0),
                                     phase="backward")
    info = dataclasses.replace(CPU, kind="cuda", index=0)
    mem = trial_untimed.memory_of_step(measured, Alloc(), info, False, 0)
    assert mem.context_gap_bytes == 9_500 - 8_000  # not 9_500 - the 12_000 peak reserved
    assert mem.reserved_at_nvml_read_bytes == 8_000 and mem.nvml_method == "by pid"
    assert mem.peak_allocated_bytes == 10_000 and mem.total_bytes == 7_000
    assert "over the 3 measured steps" in mem.notes


def test_energy_per_step_and_token_come_from_the_counter_delta(monkeypatch, fake_nvml):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    info = dataclasses.replace(CPU, kind="cuda", index=0, uuid="aaaa")
    config = _config(steps=4, batch_size=2, seq_len=32)
    state = TrialState(config, RECIPES["bf16-amp"], info)
    window = trial_steps._EnergyWindow(state)
    fake_nvml.energy_mj = 1_000_000
    window.begin()
    for _ in range(4):
        window.count(True)
    fake_nvml.energy_mj = 1_000_000 + 12_500  # 12.5 J over the window
    window.end()
    state.steps = [_step(i, False, 10.0) for i in range(4)]
    summary = state._summary()
    assert summary.energy_per_step_j == pytest.approx(12.5 / 4)
    assert summary.energy_per_token_j == pytest.approx(12.5 / 4 / (2 * 32))
    assert "energy counter delta over the 4 measured steps" in summary.energy_method


def test_energy_is_na_with_the_reason_on_the_cpu():
    result = run_trial(_config(steps=2), "fp32", CPU, lambda e: None, lambda: False)
    assert result.summary.energy_per_step_j is None
    assert "CPU" in result.summary.energy_method


def _step(i, skipped, ms):
    return trial_steps.StepSample("fp16-amp", i, False, 1.0, ms, 1.0, None, None, None, None,
                                1.0, skipped, 1.0, 0.0)


def test_skipped_steps_are_left_out_of_the_median_and_counted():
    state = TrialState(_config(), RECIPES["fp16-amp"], CPU)
    state.steps = [_step(0, True, 1.0), _step(1, False, 10.0), _step(2, True, 1.0),
                   _step(3, False, 12.0), _step(4, False, 11.0)]
    summary = state._summary()
    assert summary.median_step_ms == 11.0 and summary.skipped_steps == 2
    assert summary.steps_measured == 5
    state.steps = [_step(0, True, 1.0)]
    summary = state._summary()
    assert summary.median_step_ms is None and "skipped" in summary.mfu_reason


def test_median_of_a_real_trial_leaves_out_its_skipped_steps():
    # 2**20 may overflow fp16 in the first steps: whichever skip are left out
    result = run_trial(_config(steps=4, warmup=0, init_scale=2.0**20), "fp16-amp", CPU,
                       lambda e: None, lambda: False)
    measured = [s for s in result.steps if not s.warmup]
    timed = [s.step_ms for s in measured if not s.skipped]
    assert result.summary.skipped_steps == sum(s.skipped for s in measured)
    expected = statistics.median(timed) if timed else None
    assert result.summary.median_step_ms == expected


def test_grad_norm_is_the_l2_norm_of_the_gradients_and_leaves_them_alone():
    # random tokens: make_batches draws the same first batch here
    config = _config(steps=1, warmup=0, optimizer="sgd", data="random")
    result = run_trial(config, "fp32", CPU, lambda e: None, lambda: False)
    # the same weights and first batch, computed here
    loaded = load_model("tiny", "fp32", "cpu", config.seed)
    batch = make_batches(loaded.config, loaded.task, 2, 32, 1, config.seed, "cpu")[0]
    loaded.model(**batch).loss.backward()
    norm = math.sqrt(sum(float((p.grad.double() ** 2).sum())
                         for p in loaded.model.parameters() if p.grad is not None))
    assert result.steps[0].grad_norm == pytest.approx(norm, rel=1e-4)
    with torch.no_grad():
        assert result.steps[0].loss == pytest.approx(float(loaded.model(**batch).loss), rel=1e-5)


# --- optimiser and recipe texts --------------------------------------------------------


def test_fused_optimisers_on_cuda_and_the_recipe_text_says_so():
    params = [torch.nn.Parameter(torch.zeros(4))]
    assert make_optimizer("adamw", params, 1e-3, fused=True).defaults["fused"] is True
    assert make_optimizer("sgd", params, 1e-3, fused=True).defaults["fused"] is True
    assert not make_optimizer("adamw", params, 1e-3).defaults["fused"]
    for rec in RECIPES.values():
        text = run_description(rec, "cuda", "adamw", rec.fp8)
        assert "AdamW with fused=True" in text
        assert "fused" not in run_description(rec, "cpu", "adamw", False)


def test_a_cuda_trial_builds_a_fused_optimizer(monkeypatch):
    seen = {}

    def spy(*args, **kw):
        seen.update(kw)
        raise RuntimeError("stop here")

    monkeypatch.setattr(trial_setup, "make_optimizer", spy)
    monkeypatch.setattr(trial_setup, "load_model", lambda *a, **k: _loaded_tiny())
    info = dataclasses.replace(CPU, kind="cuda", index=0)
    monkeypatch.setattr(DeviceInfo, "torch_device", property(lambda self: torch.device("cpu")))
    monkeypatch.setattr(DeviceInfo, "device_context", lambda self: torch.no_grad())
    result = run_trial(_config(), "fp16-amp", info, lambda e: None, lambda: False)
    assert "stop here" in result.reason and seen["fused"] is True


def _loaded_tiny():
    return load_model("tiny", "fp32", "cpu", 0)


def test_fp8_compiles_by_default_or_says_eager_is_not_representative():
    fp8 = RECIPES["fp8"]
    assert "torch.compile by default" in fp8.description
    assert "NOT representative" in run_description(fp8, "cuda", "adamw", compiled=False)
    assert "NOT representative" not in run_description(fp8, "cuda", "adamw", compiled=True)
    # an fp8 trial that never ran (unsupported, as on an A100) claims nothing about how it ran
    a100 = dataclasses.replace(CPU, unsupported={**CPU.unsupported, "fp8": "no fp8 cores"})
    assert "eagerly" not in run_trial(_config(), "fp8", a100, lambda e: None,
                                      lambda: False).recipe


@pytest.mark.parametrize("warmup", [0, 1])
def test_fp8_trials_compile_when_a_warmup_step_allows_else_say_eager(warmup, monkeypatch):
    # torchao float8 runs on the CPU too, through torch._scaled_mm; compiling it here
    # would take minutes, so torch.compile is spied on (the model stays eager)
    compiled = []
    monkeypatch.setattr(trial_mod.torch, "compile", lambda model: compiled.append(model) or model)
    # the verdicts of an H100 (compute capability 9.0): float8 native, so it compiles
    h100 = gating.matrix(gating.DeviceDescription("cuda", "NVIDIA H100 80GB HBM3", (9, 0)))
    fp8_device = dataclasses.replace(CPU, unsupported={}, fp8_supported=True, verdicts=h100)
    result = run_trial(_config(batch_size=1, seq_len=16, steps=1, warmup=warmup), "fp8",
                       fp8_device, lambda e: None, lambda: False)
    assert result.status == "ok", result.reason
    assert len(compiled) == warmup
    assert ("NOT representative" in result.recipe) == (warmup == 0)


@pytest.mark.parametrize(("batch", "seq", "fragment"), [(3, 5, "batch x sequence = 15"),
                                                        (1, 24, "= 24")])
def test_fp8_shapes_not_divisible_by_16_are_unsupported_not_an_error(batch, seq, fragment):
    fp8_device = dataclasses.replace(CPU, unsupported={}, fp8_supported=True)
    result = run_trial(_config(batch_size=batch, seq_len=seq), "fp8", fp8_device,
                       lambda e: None, lambda: False)
    assert result.status == "unsupported" and fragment in result.reason
    assert "16" in result.reason
    assert fp8_shape_reason(2 * 32, 100).startswith("float8 GEMMs") and "width (100)" in (
        fp8_shape_reason(2 * 32, 100))
    assert fp8_shape_reason(2 * 32, 128) is None


def test_int8_scales_its_loss_and_says_what_runs():
    rec = RECIPES["int8"]
    assert rec.use_scaler and "GradScaler" in rec.description
    assert "prepare_model_for_kbit_training" in rec.description
    result = run_trial(_config(steps=2), "int8", CPU, lambda e: None, lambda: False)
    assert result.status == "ok", result.reason
    assert all(s.loss_scale is not None for s in result.steps)


def test_library_syncs_are_named_for_the_recipes_they_affect():
    int8 = library_sync_notes(RECIPES["int8"], "causal-lm", False, "adamw", "cuda")
    assert any("outliers.any()" in n for n in int8)
    assert any("find_packed_sequence_indices" in n for n in int8)
    bf16 = library_sync_notes(RECIPES["bf16-amp"], "causal-lm", True, "adamw", "cuda")
    assert bf16 == []  # compiled: the mask check is traced away
    scaled_8bit = library_sync_notes(RECIPES["fp16-amp"], "masked-lm", False, "adamw8bit",
                                     "cuda")
    assert len(scaled_8bit) == 1 and "AdamW8bit" in scaled_8bit[0]
    assert library_sync_notes(RECIPES["int8"], "causal-lm", False, "adamw", "cpu") == []


def test_tf32_goes_through_the_fp32_precision_api_and_is_restored():
    before = torch.backends.cuda.matmul.fp32_precision
    with fp32_precision(RECIPES["tf32"]):
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
        assert torch.backends.cudnn.conv.fp32_precision == "tf32"
    with fp32_precision(RECIPES["fp32"]):
        assert torch.backends.cuda.matmul.fp32_precision == "ieee"
        assert torch.backends.cudnn.conv.fp32_precision == "ieee"
    assert torch.backends.cuda.matmul.fp32_precision == before
    torch.get_float32_matmul_precision()  # raises if the legacy and new APIs were mixed


def test_engine_sets_tf32_only_through_the_new_api():
    legacy = re.compile(r"allow_tf32\s*=|set_float32_matmul_precision\(")
    for path in (ROOT / "engine").rglob("*.py"):
        assert not legacy.search(path.read_text(encoding="utf-8")), path


# --- config and device ---------------------------------------------------------------


def test_compile_needs_a_warmup_step():
    with pytest.raises(ValueError, match="--warmup 1"):
        RunConfig(compile=True, warmup=0)
    assert RunConfig(compile=True, warmup=1).compile


def test_cli_refuses_compile_without_warmup_in_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "main.py", "profile", "--model", "tiny", "--precision", "fp32",
         "--device", "cpu", "--compile", "--warmup", "0", "--out", str(tmp_path / "r.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "--warmup 1" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r.json").exists()


@pytest.fixture
def old_driver(monkeypatch):
    def init():
        raise RuntimeError("The NVIDIA driver on your system is too old (found version "
                           "11040). Please update your GPU driver.\nmore text")

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "init", init)


def test_auto_falling_back_to_the_cpu_says_the_driver_is_too_old(old_driver):
    info = probe("auto")
    assert info.kind == "cpu"
    assert "--device auto chose the CPU" in info.fallback_reason
    assert "driver on your system is too old" in info.fallback_reason
    assert "too old" in info.describe()  # every trial's device line says it too
    with pytest.raises(ValueError, match="too old"):
        probe("cuda")
    record = Runner(_config(steps=1, warmup=0, device="auto")).run()
    warnings = [x.message for x in record.logs if x.level == "warning"]
    assert any("too old" in w for w in warnings)


def test_a_cpu_build_falls_back_silently():
    if torch.version.cuda:
        pytest.skip("a CUDA build of torch")
    assert probe("auto").fallback_reason is None


def test_gpu_acceptance_without_cuda_runs_nothing_and_says_so(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the script would run")
    proc = subprocess.run([sys.executable, "scripts/gpu_acceptance.py"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1 and "nothing was run" in lines[0]
    assert not any((ROOT / "docs" / "results").glob("*-acceptance.md"))


def test_html_report_shows_trial_notes_energy_and_the_nvml_method():
    from engine.report.html import render_html
    from tests.engine.sample_record import make_record

    record = make_record()
    trial = record.trials[0]
    notes = library_sync_notes(RECIPES["int8"], "causal-lm", False, "adamw", "cuda")
    summary = dataclasses.replace(trial.summary, energy_per_step_j=2.5, energy_per_token_j=0.01,
                                  energy_method="NVML total-energy counter delta")
    memory = dataclasses.replace(trial.memory, nvml_method=nvml.BASELINE_METHOD)
    record.trials[0] = dataclasses.replace(trial, notes=notes, summary=summary, memory=memory)
    page = render_html(record)
    assert "find_packed_sequence_indices" in page and "int8_vectorwise_quant" in page
    assert "2.5 J / 0.01 J (NVML total-energy counter delta)" in page
    assert "minus a baseline read before the trial" in page


def _acceptance_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_acceptance",
                                                  ROOT / "scripts" / "gpu_acceptance.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module



def test_the_monitor_chart_says_what_the_power_reading_averages():
    from engine.report.charts import monitor_chart
    from tests.engine.sample_record import make_record

    record = make_record()
    record.environment = {"device": {"power_method": nvml.power_method((9, 0))}}
    assert "1 s average" in monitor_chart(record).note


def test_runs_with_fp8_are_not_interleaved_by_default_since_fp8_compiles():
    from engine.run.rounds import choose_rounds

    config = _config(precisions=("bf16-amp", "fp8"), steps=20, warmup=1, interleave="auto")
    rounds, why = choose_rounds(config, params=10_000_000)
    assert rounds == 1 and "fp8 trials are compiled" in why
    eager = config.replace(warmup=0)  # nothing compiles without a warm-up step
    assert choose_rounds(eager, params=10_000_000)[0] > 1
    # what an H100 (sm90) reports: float8 native there, so its trials compile
    h100 = SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0,
                           multi_processor_count=132, total_memory=80 * 2**30)
    info = DeviceInfo(kind="cuda", index=0, name=h100.name, compute_capability=(9, 0),
                      total_memory_bytes=None, cuda_version="13.0", driver_version=None,
                      nvml_available=False, bf16_supported=True, tf32_supported=True,
                      fp8_supported=True, verdicts=gating.matrix(
                          gating.DeviceDescription.from_properties(h100)))
    rounds, why = choose_rounds(config, params=10_000_000, info=info)
    assert rounds == 1 and "fp8 trials are compiled" in why


def test_emulated_fp8_on_the_cpu_is_interleaved_and_not_compiled():
    """The runner's own choice: on the CPU float8 is emulated, so it is not compiled and
    nothing stops a cheap run from alternating in rounds."""
    logs = []
    config = _config(precisions=("bf16-amp", "fp8"), steps=10, warmup=1, interleave="auto",
                     batch_size=1, seq_len=16, profile_step=False)
    record = Runner(config, logs.append).run()
    assert any("interleaved in 2 rounds" in getattr(e, "message", "") for e in logs)
    fp8 = record.trial("fp8")
    assert fp8.status == "ok" and "ran eagerly (float8 is fast only compiled)" in fp8.recipe
    assert any(n.startswith("emulated:") for n in fp8.notes)
