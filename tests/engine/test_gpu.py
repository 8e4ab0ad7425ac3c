"""What only a CUDA GPU can answer. Marked ``gpu``: skipped on machines without CUDA.

Each check runs in its own Python process (``_in_child``): a sticky CUDA error (an
illegal address, a device-side assert) poisons the process that met it, and must not
fail the checks after it. The ``check_*`` functions run in that child and return
plain data; the tests assert on it here.
"""

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
MARK = "AMPSCOPE-CHECK "


def _in_child(check: str, env: dict | None = None, **kwargs):
    """Run ``check_<check>(**kwargs)`` in a fresh interpreter; returns what it returned."""
    code = ("import json, sys\n"
            "from tests.engine import test_gpu as t\n"
            f"out = t.check_{check}(**json.loads(sys.argv[1]))\n"
            f"print({MARK!r} + json.dumps(out))\n")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(kwargs)], cwd=ROOT,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=900)  # a hang guard, not a speed limit
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len(MARK):])


def _config(**kw):
    from engine.core.config import RunConfig

    base = dict(model="gpt2", batch_size=4, seq_len=256, steps=6, warmup=2, device="cuda",
                isolation="inline")
    base.update(kw)
    return RunConfig(**base)


def _trial(precision: str, **kw):
    from engine.measure.device import probe
    from engine.run.trial import run_trial

    config = _config(**kw)
    info = probe(config.device)
    return run_trial(config, precision, info, lambda e: None, lambda: False), info


# --- checks (run in the child) --------------------------------------------------------


def check_recipe(precision: str) -> dict:
    result, info = _trial(precision)
    mem = result.memory
    return {
        "unsupported": info.unsupported_reason(precision),
        "status": result.status,
        "reason": result.reason,
        "peak_allocated": mem.peak_allocated_bytes if mem else None,
        "peak_reserved": mem.peak_reserved_bytes if mem else None,
        "params_plus_opt": (mem.params_bytes + mem.optimizer_bytes) if mem else None,
        "step_alloc": [s.allocated_bytes for s in result.steps],
        "mfu": result.summary.mfu if result.summary else None,
        "recipe": result.recipe,
    }


def check_timer_vs_wall(device: str) -> dict:
    """Median CUDA-event step time against the wall-clock gaps between step read-backs.

    In a GPU-bound loop the host waits at each read-back for that step's end event, so
    the gap between consecutive reads is one step of GPU time.
    """
    import torch

    result, info = _trial("bf16-amp", device=device, batch_size=8, seq_len=512, steps=12,
                          warmup=3)
    measured = [s for s in result.steps if not s.warmup]
    gaps = [b.time_s - a.time_s for a, b in zip(measured, measured[1:])]
    return {
        "status": result.status,
        "reason": result.reason,
        "event_ms": statistics.median(s.step_ms for s in measured),
        "wall_ms": statistics.median(gaps) * 1e3,
        "current_device_after": torch.cuda.current_device(),
        "peak_allocated": result.memory.peak_allocated_bytes,
        "device_index": info.index,
        # nothing of a cuda:1 trial may land on GPU 0
        "gpu0_reserved_ever": torch.cuda.max_memory_reserved(0),
    }


def check_nvml_by_uuid() -> dict:
    import pynvml
    import torch

    from engine.measure.device import probe

    info = probe("cuda")
    h = info.nvml_handle()
    nvml_uuid = pynvml.nvmlDeviceGetUUID(h) if h is not None else None
    return {"torch_uuid": str(torch.cuda.get_device_properties(0).uuid),
            "nvml_uuid": nvml_uuid, "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}


def check_nvml_in_process_run() -> dict:
    from engine.measure import nvml
    from engine.run.runner import Runner

    record = Runner(_config(model="tiny", precisions=("bf16-amp",), isolation="process")).run()
    samples = [m for m in record.monitor_samples if m.source == "nvml"]
    trial = record.trials[0]
    mem = trial.memory
    return {
        "nvml": nvml.available(),
        "status": trial.status,
        "reason": trial.reason,
        "samples": len(samples),
        "total": [m.gpu_mem_total_bytes for m in samples][-1:] or [None],
        "process_mem": [m.process_mem_bytes for m in samples if m.process_mem_bytes],
        "nvml_process_bytes": mem.nvml_process_bytes if mem else None,
        "nvml_method": mem.nvml_method if mem else None,
        "context_gap": mem.context_gap_bytes if mem else None,
        "energy_per_step_j": trial.summary.energy_per_step_j if trial.summary else None,
        "energy_method": trial.summary.energy_method if trial.summary else None,
    }


def check_no_host_sync_in_steps() -> dict:
    """fp16-amp steps (GradScaler, fused AdamW) on a masked LM, which has no library sync.

    ``torch.cuda.set_sync_debug_mode("error")`` makes any synchronising call inside the
    training loop raise, and the trial reports where.
    """
    import torch

    from engine.run import trial_steps

    real = trial_steps.train_steps

    def strict(*args, **kwargs):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return real(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    trial_steps.train_steps = strict
    trial_steps._drain = lambda info: None  # drains the GPU on purpose, between windows
    result, _ = _trial("fp16-amp", model="bert-base", batch_size=2, seq_len=128)
    return {"status": result.status, "reason": result.reason,
            "skipped": result.summary.skipped_steps if result.summary else None}


def check_same_start_on_gpu() -> dict:
    import torch

    from engine.models.load import load_model

    cpu = load_model("tiny", "fp32", "cpu", seed=3).model
    gpu = load_model("tiny", "bf16", "cuda", seed=3).model
    same = all(torch.equal(a.to(torch.bfloat16), b.cpu())
               for a, b in zip(cpu.parameters(), gpu.parameters()))
    return {"same": same}


def check_tf32_compiled() -> dict:
    result, _ = _trial("tf32", model="tiny", compile=True, steps=2, warmup=1)
    return {"status": result.status, "reason": result.reason}


def check_fp8(warmup: int) -> dict:
    result, info = _trial("fp8", warmup=warmup, steps=3)
    return {"cc": list(info.compute_capability), "status": result.status,
            "reason": result.reason, "recipe": result.recipe}


def check_sticky_error_then_ok(folder: str) -> dict:
    from engine.run.runner import Runner

    bad = Runner(_config(model=folder, precisions=("fp32",), isolation="process",
                         batch_size=2, seq_len=32, steps=2, warmup=1)).run()
    good = Runner(_config(model="tiny", precisions=("fp32",), isolation="process",
                          batch_size=2, seq_len=32, steps=2, warmup=1)).run()
    return {"bad": [bad.trials[0].status, bad.trials[0].reason],
            "good": [good.trials[0].status, good.trials[0].reason]}


# --- tests ------------------------------------------------------------------------------


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16-amp", "bf16-amp", "fp16", "bf16",
                                       "int8", "nf4"])
def test_each_recipe_trains_on_the_gpu_with_allocator_numbers(precision):
    out = _in_child("recipe", precision=precision)
    if out["unsupported"]:
        assert out["status"] == "unsupported"
        return
    assert out["status"] == "ok", out["reason"]
    assert out["peak_allocated"] >= out["params_plus_opt"]
    assert out["peak_reserved"] >= out["peak_allocated"]
    assert all(out["step_alloc"])
    assert "fused=True" in out["recipe"]
    assert out["mfu"] is None or 0 < out["mfu"] < 1


def test_cuda_step_time_matches_the_wall_clock_between_steps():
    out = _in_child("timer_vs_wall", device="cuda")
    assert out["status"] == "ok", out["reason"]
    assert 1.0 <= out["wall_ms"] / out["event_ms"] <= 1.10, out


def test_cuda_1_is_timed_and_measured_on_gpu_1():
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU: cuda:1 needs two")
    out = _in_child("timer_vs_wall", device="cuda:1")
    assert out["status"] == "ok", out["reason"]
    assert 1.0 <= out["wall_ms"] / out["event_ms"] <= 1.10, out  # ~0 ms if timed on GPU 0
    assert out["current_device_after"] == 0  # inline trials restore the current device
    assert out["peak_allocated"] > 0 and out["gpu0_reserved_ever"] == 0


def test_nvml_watches_the_gpu_torch_uses_under_cuda_visible_devices():
    import torch

    last = torch.cuda.device_count() - 1
    uuid = str(torch.cuda.get_device_properties(last).uuid)
    # the last GPU, named by index (or by UUID on one GPU), becomes torch's cuda:0
    visible = str(last) if last else f"GPU-{uuid}"
    out = _in_child("nvml_by_uuid", env={"CUDA_VISIBLE_DEVICES": visible})
    if out["nvml_uuid"] is None:
        pytest.skip("NVML unavailable")
    assert out["torch_uuid"] == uuid
    assert out["nvml_uuid"].removeprefix("GPU-").removeprefix("MIG-") == uuid


def test_nvml_samples_and_process_memory_during_a_process_isolated_run():
    out = _in_child("nvml_in_process_run")
    if not out["nvml"]:
        pytest.skip("NVML unavailable")
    assert out["status"] == "ok", out["reason"]
    assert out["samples"] and out["total"][0] > 0
    assert out["process_mem"], "NVML never found the trial's memory"
    assert out["nvml_process_bytes"] and out["nvml_method"]
    assert out["context_gap"] > 0  # the CUDA context is outside the allocator
    assert out["energy_per_step_j"] is None or out["energy_per_step_j"] > 0
    assert out["energy_method"]


def test_training_steps_make_no_host_sync():
    out = _in_child("no_host_sync_in_steps")
    assert out["status"] == "ok", out["reason"]


def test_every_recipe_starts_from_the_cpu_drawn_weights():
    assert _in_child("same_start_on_gpu")["same"]


def test_tf32_compiles_through_the_fp32_precision_api():
    out = _in_child("tf32_compiled")
    assert out["status"] in ("ok", "unsupported"), out["reason"]


@pytest.mark.parametrize("warmup", [0, 2])
def test_fp8_runs_compiled_by_default_or_eager_labelled(warmup):
    out = _in_child("fp8", warmup=warmup)
    if tuple(out["cc"]) < (8, 9):
        assert out["status"] == "unsupported" and "8.9" in out["reason"]
        return
    assert out["status"] == "ok", out["reason"]
    assert ("NOT representative" in out["recipe"]) == (warmup == 0)


def test_a_device_side_assert_is_that_trials_error_and_the_next_trial_runs(tmp_path):
    # a masked LM whose mask token is outside its vocabulary: the embedding lookup trips a
    # device-side assert inside the trial process
    config = {"model_type": "bert", "architectures": ["BertForMaskedLM"], "vocab_size": 512,
              "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
              "intermediate_size": 128, "max_position_embeddings": 64,
              "mask_token_id": 100000}
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    out = _in_child("sticky_error_then_ok", folder=str(tmp_path))
    assert out["bad"][0] == "error", out["bad"]
    assert out["good"][0] == "ok", out["good"]
