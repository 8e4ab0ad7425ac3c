"""A user's run (ampscope.Recorder) is summarised by the code that summarises a profile
trial (issue #20): the same peak lookup (a MIG slice's share, blended by the dtypes the
counted FLOPs ran in), the same medians and the same count of skipped steps.

Real tiny training loops on the CPU, two model families; the device is what
torch.cuda/NVML report inside an H100 MIG 1g slice (tests/engine/test_gpu_figures.py).
"""

import copy
import json
import statistics
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import ampscope
import ampscope.recorder as recorder_mod
from ampscope.counting_step import COUNT_STEP
from engine.models.load import load_model
from tests.engine.test_gpu_figures import mig_slice  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]
MEASURED_FROM = COUNT_STEP + 1  # steps 0 (warm-up) and 1 (FLOP count) are not


def gpt2_tiny():
    return load_model("tiny", "fp32", "cpu", 0).model


def llama_tiny():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))


FAMILIES = [pytest.param(gpt2_tiny, id="gpt2"), pytest.param(llama_tiny, id="llama")]


def _batch():
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids}


def _fp32_head(model):
    """The loop keeps the output layer in fp32 under bf16 autocast (as users keep a layer
    high), so the step's matmul FLOPs run in two dtypes."""
    head = model.lm_head

    def forward(x):
        with torch.autocast("cpu", enabled=False):
            return torch.nn.functional.linear(x.float(), head.weight.float(), head.bias)

    head.forward = forward


def _h100_slice_peak(by_dtype: dict) -> float:
    """The datasheet table's H100 SXM5 row, 16 of its SMs (a 1g slice), each dtype's FLOPs
    at its own peak: total FLOPs over the time they take."""
    rows = json.loads((ROOT / "resources" / "peak_flops.json").read_text(encoding="utf-8"))
    row = next(g for g in rows["gpus"] if g["name"] == "NVIDIA H100 SXM5")
    share = 16 / row["sm_count"]
    seconds = sum(f / (row["peak_tflops"][d] * 1e12 * share) for d, f in by_dtype.items())
    return sum(by_dtype.values()) / seconds


@pytest.mark.parametrize("make_model", FAMILIES)
def test_a_recorded_run_on_a_mig_slice_divides_by_the_slice_s_blended_peak(
        make_model, mig_slice, monkeypatch, tmp_path):  # noqa: F811
    info, _ = mig_slice
    monkeypatch.setattr(recorder_mod, "probe", lambda requested: info)
    model = make_model()
    _fp32_head(model)
    batch = _batch()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with ampscope.Recorder(model, opt, journal=tmp_path / "run.jsonl") as rec:
        for _ in range(5):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            rec.step()
    (trial,) = rec.record.trials
    assert trial.precision == "bf16-amp"
    by_dtype = trial.flops.by_peak_dtype
    assert set(by_dtype) == {"bf16", "fp32"}  # the body in bf16, the output layer in fp32
    peak = _h100_slice_peak(by_dtype)
    summary = trial.summary
    assert summary.peak_flops == pytest.approx(peak, rel=1e-9)
    assert "bf16" in summary.peak_flops_source and "fp32" in summary.peak_flops_source
    measured = trial.steps[MEASURED_FROM:]
    median_s = statistics.median(s.step_ms for s in measured) / 1e3
    model_flops = trial.flops.analytic_per_step
    assert summary.mfu == pytest.approx(model_flops / median_s / peak, rel=1e-9)
    assert summary.hfu == pytest.approx(trial.flops.counted_per_step / median_s / peak,
                                        rel=1e-9)
    for s in measured:
        assert s.mfu == pytest.approx(model_flops / (s.step_ms / 1e3) / peak, rel=1e-9)


@pytest.mark.parametrize("make_model", FAMILIES)
def test_a_recorded_run_s_medians_and_skips_count_the_measured_steps_only(make_model,
                                                                          tmp_path):
    """A GradScaler whose first scale overflows skips steps, warm-up steps included: only
    the measured ones are counted, and the step time and tokens/s are medians over the
    measured steps it did not skip (an even number of them, where the median of each
    step's tokens/s and tokens over the median step time differ)."""
    batch = _batch()

    def train(net, steps, recorder=None):
        opt = torch.optim.SGD(net.parameters(), lr=1e-2)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127, growth_interval=1000)
        skipped = []
        rec = recorder(net, opt, scaler) if recorder else None
        for _ in range(steps):
            before = scaler.get_scale()
            scaler.scale(net(**batch).loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            skipped.append(scaler.get_scale() < before)
            if rec:
                rec.step(loss=torch.tensor(0.0))
        if rec:
            rec.finish()
        return skipped

    model = make_model()
    # the same model and batch skip the same steps: pick a length with an even number of
    # timed measured steps
    pattern = train(copy.deepcopy(model), 12)
    steps = next(n for n in range(MEASURED_FROM + 4, 13)
                 if pattern[MEASURED_FROM:n].count(False) % 2 == 0
                 and any(pattern[MEASURED_FROM:n]))
    rec_of = {}

    def recorder(net, opt, scaler):
        rec_of["rec"] = ampscope.Recorder(net, opt, scaler, journal=tmp_path / "s.jsonl")
        return rec_of["rec"]

    skipped = train(model, steps, recorder)
    (trial,) = rec_of["rec"].record.trials
    assert [s.skipped for s in trial.steps] == skipped == pattern[:steps]
    assert any(skipped[:MEASURED_FROM])  # a warm-up step was skipped: not counted
    measured = trial.steps[MEASURED_FROM:]
    ms = sorted(s.step_ms for s in measured if not s.skipped)
    assert len(ms) % 2 == 0
    median_ms = (ms[len(ms) // 2 - 1] + ms[len(ms) // 2]) / 2
    summary = trial.summary
    assert summary.steps_measured == steps - MEASURED_FROM
    assert summary.skipped_steps == sum(skipped[MEASURED_FROM:])
    assert summary.median_step_ms == pytest.approx(median_ms, rel=1e-12)
    tokens = batch["input_ids"].numel()
    assert {s.tokens for s in measured} == {tokens}
    assert summary.tokens_per_s == pytest.approx(tokens / (median_ms / 1e3), rel=1e-12)
    assert summary.tflops == pytest.approx(
        trial.flops.analytic_per_step / (median_ms / 1e3) / 1e12, rel=1e-12)
