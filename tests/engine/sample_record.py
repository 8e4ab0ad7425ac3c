"""A hand-built run record with realistic numbers (GPT-2 small on an A100, 4 precisions).

Shared by the comparison and report tests; built from the real event dataclasses so
a change to them breaks these tests rather than passing silently.
"""

from __future__ import annotations

from engine.core.events import (
    FlopsInfo,
    LogEvent,
    MemoryBreakdown,
    ModuleInfo,
    MonitorSample,
    ParamInfo,
    PredictedMemory,
    StepSample,
    TrialResult,
    TrialSummary,
)
from engine.record.run_record import RunRecord

PARAMS = 124_439_808
TOKENS = 8 * 512
T0 = 1_760_000_000.0
GiB = 1024**3


def _steps(precision, step_ms, losses, *, scale=None, skipped=(), mfu=None, t0=0.0):
    out = []
    for i, loss in enumerate(losses):
        ms = step_ms * (1.6 if i == 0 else 1.0 + 0.01 * (i % 3))
        tflops = 6 * PARAMS * TOKENS / (ms / 1000) / 1e12
        out.append(
            StepSample(
                precision=precision,
                step=i,
                warmup=i == 0,
                loss=loss,
                step_ms=ms,
                tokens_per_s=TOKENS / (ms / 1000),
                tflops=tflops,
                mfu=None if mfu is None else tflops * 1e12 / mfu,
                allocated_bytes=int(2.1 * GiB) + i * 4096,
                reserved_bytes=int(2.5 * GiB),
                loss_scale=None if scale is None else scale / (2 ** sum(s <= i for s in skipped)),
                skipped=i in skipped,
                grad_norm=None if i in skipped else 1.9 - 0.1 * i,
                time_s=T0 + t0 + i * step_ms / 1000,
            )
        )
    return out


def _params(weight_dtype):
    return [
        ParamInfo("transformer.wte.weight", (50257, 768), "torch.float32", "cuda:0",
                  50257 * 768 * 4, 50257 * 768, True, "Embedding"),
        ParamInfo("transformer.h.0.attn.c_attn.weight", (768, 2304), weight_dtype, "cuda:0",
                  768 * 2304 * 4, 768 * 2304, True, "Conv1D"),
        ParamInfo("lm_head.weight", (50257, 768), "torch.float32", "cuda:0", 0, 50257 * 768,
                  True, "Linear", tied_to="transformer.wte.weight"),
    ]


def _trial(precision, step_ms, losses, peak_gib, *, scale=None, skipped=(), peak_flops=None,
           t0=0.0, weight_dtype="torch.float32", act_bytes=int(0.9 * GiB)):
    steps = _steps(precision, step_ms, losses, scale=scale, skipped=skipped, mfu=peak_flops,
                   t0=t0)
    measured = [s for s in steps if not s.warmup]
    median = sorted(s.step_ms for s in measured)[len(measured) // 2]
    tflops = 6 * PARAMS * TOKENS / (median / 1000) / 1e12
    return TrialResult(
        precision=precision,
        status="ok",
        recipe=f"{precision} recipe",
        device="NVIDIA A100-SXM4-40GB",
        param_count=PARAMS,
        trainable_params=PARAMS,
        load_footprint_bytes=510_342_144,
        footprint_note="lm_head is tied to wte and counted once",
        memory=MemoryBreakdown(
            params_bytes=PARAMS * 4,
            grads_bytes=PARAMS * 4,
            optimizer_bytes=PARAMS * 8,
            activations_bytes=act_bytes,
            activations_method="allocator delta across forward",
            peak_allocated_bytes=int(peak_gib * GiB),
            peak_reserved_bytes=int((peak_gib + 0.4) * GiB),
            total_bytes=int(peak_gib * GiB),
            total_method="torch.cuda.max_memory_allocated",
        ),
        predicted_memory=PredictedMemory(
            params_bytes=PARAMS * 4,
            master_bytes=0,
            grads_bytes=PARAMS * 4,
            optimizer_bytes=PARAMS * 8,
            activations_bytes=int(0.85 * GiB),
            total_bytes=int((peak_gib - 0.1) * GiB),
            bytes_per_param={"weights": 4, "grads": 4, "adam": 8},
            formula="16 bytes/param + activations",
            error_pct={"params": 0.0, "activations": 5.6},
        ),
        dtype_map=_params(weight_dtype),
        module_tree=[
            ModuleInfo("", "GPT2LMHeadModel", 0, PARAMS * 4, PARAMS, False),
            ModuleInfo("transformer.h.0", "GPT2Block", 2, 28_348_416, 7_087_104, False),
        ],
        flops=FlopsInfo(
            counted_per_step=3_120_000_000_000,
            counted_method="torch.utils.flop_counter",
            analytic_per_step=6 * PARAMS * TOKENS,
            analytic_formula="6 x tokens x params",
            by_op={"aten.mm": 3_000_000_000_000, "aten.bmm": 120_000_000_000},
        ),
        steps=steps,
        summary=TrialSummary(
            steps_measured=len(measured),
            median_step_ms=median,
            tokens_per_s=TOKENS / (median / 1000),
            tflops=tflops,
            mfu=None if peak_flops is None else tflops * 1e12 / peak_flops,
            mfu_reason=None if peak_flops else "no datasheet peak for int8 matmuls on A100",
            peak_flops=peak_flops,
            peak_flops_source="A100 datasheet, dense" if peak_flops else None,
            peak_memory_bytes=int(peak_gib * GiB),
            peak_memory_method="torch.cuda.max_memory_allocated",
            skipped_steps=len(skipped),
            final_loss=losses[-1],
            final_loss_scale=None if scale is None else steps[-1].loss_scale,
        ),
        started_s=T0 + t0,
        finished_s=T0 + t0 + len(losses) * step_ms / 1000,
    )


def make_record(*, with_fp32: bool = True) -> RunRecord:
    trials = [
        _trial("bf16-amp", 160.0, [10.98, 10.41, 9.87, 9.40, 9.02], 3.1,
               peak_flops=312e12, t0=10.0),
        _trial("fp16-amp", 158.0, [10.98, 10.98, 10.40, 9.86, 9.39], 3.0, scale=65536.0,
               skipped=(0, 1), peak_flops=312e12, t0=20.0, weight_dtype="torch.float32"),
        _trial("int8", 240.0, [10.99, 10.50, 10.02, 9.60, 9.25], 1.9, t0=30.0,
               weight_dtype="torch.int8", act_bytes=None),
        TrialResult(
            precision="fp8",
            status="unsupported",
            reason="fp8 training needs compute capability 8.9+ (Ada, Hopper); A100 is 8.0",
            started_s=T0 + 40,
            finished_s=T0 + 40,
        ),
    ]
    if with_fp32:
        trials.insert(
            0, _trial("fp32", 410.0, [10.98, 10.40, 9.86, 9.38, 9.00], 5.2, peak_flops=19.5e12)
        )
    return RunRecord(
        run_id="20251009-120000-gpt2",
        config={
            "model": "gpt2",
            "precisions": [t.precision for t in trials],
            "batch_size": 8,
            "seq_len": 512,
            "steps": 5,
            "warmup": 1,
        },
        environment={
            "device": "NVIDIA A100-SXM4-40GB",
            "versions": {"torch": "2.13.0", "transformers": "5.23.0", "python": "3.11.9"},
        },
        trials=trials,
        monitor_samples=[
            MonitorSample(
                time_s=T0 + 0.5 * i,
                source="nvml",
                gpu_util_pct=min(99.0, 20.0 + 9 * i),
                mem_util_pct=40.0,
                gpu_mem_used_bytes=int((1.0 + 0.05 * i) * GiB),
                gpu_mem_total_bytes=40 * GiB,
                power_w=90.0 + 10 * (i % 20),
                temperature_c=55.0,
            )
            for i in range(80)
        ],
        logs=[
            LogEvent("info", "loaded gpt2 at fp32", "fp32", T0),
            LogEvent("warning", "fp16-amp skipped 2 steps: inf gradients", "fp16-amp", T0 + 21),
        ],
        status="ok",
        started_s=T0,
        finished_s=T0 + 41,
    )
