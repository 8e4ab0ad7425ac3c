"""What only a CUDA GPU can answer. Marked ``gpu``: skipped on machines without CUDA."""

import pytest
import torch

from engine import nvml
from engine.config import RunConfig
from engine.device import probe
from engine.runner import Runner
from engine.trial import run_trial

pytestmark = pytest.mark.gpu


def _config(**kw):
    base = dict(model="gpt2", batch_size=4, seq_len=256, steps=5, warmup=2, device="cuda",
                isolation="inline")
    base.update(kw)
    return RunConfig(**base)


def _trial(precision, **kw):
    info = probe("cuda")
    return run_trial(_config(**kw), precision, info, lambda e: None, lambda: False), info


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16-amp", "bf16-amp", "fp16", "bf16",
                                       "int8", "nf4"])
def test_each_recipe_trains_on_the_gpu_with_allocator_numbers(precision):
    result, info = _trial(precision)
    if info.unsupported_reason(precision):
        assert result.status == "unsupported"
        return
    assert result.status == "ok", result.reason
    mem = result.memory
    assert mem.peak_allocated_bytes >= mem.params_bytes + mem.optimizer_bytes
    assert mem.peak_reserved_bytes >= mem.peak_allocated_bytes
    assert all(s.allocated_bytes and s.reserved_bytes for s in result.steps)


def test_mfu_uses_the_datasheet_peak_or_says_why_not():
    result, info = _trial("bf16-amp")
    summary = result.summary
    if summary.peak_flops is None:
        assert summary.mfu is None and info.name in summary.mfu_reason
    else:
        assert 0 < summary.mfu < 1
        assert summary.tflops * 1e12 == pytest.approx(summary.mfu * summary.peak_flops)


def test_fp8_runs_or_is_unsupported_with_the_capability():
    result, info = _trial("fp8")
    if info.compute_capability < (8, 9):
        assert result.status == "unsupported" and "8.9" in result.reason
    else:
        assert result.status == "ok", result.reason


def test_nvml_samples_during_a_process_isolated_run():
    record = Runner(_config(model="tiny", precisions=("bf16-amp",), isolation="process")).run()
    nvml_samples = [m for m in record.monitor_samples if m.source == "nvml"]
    if not nvml.available():
        pytest.skip(f"NVML unavailable: {nvml.unavailable_reason()}")
    assert nvml_samples and nvml_samples[-1].gpu_mem_total_bytes > 0
    assert record.trials[0].status == "ok"


def test_cuda_step_timer_agrees_with_wall_clock():
    result, _ = _trial("fp16-amp", steps=3, warmup=1)
    elapsed_ms = (result.finished_s - result.started_s) * 1e3
    assert sum(s.step_ms for s in result.steps) < elapsed_ms
    torch.cuda.synchronize()
