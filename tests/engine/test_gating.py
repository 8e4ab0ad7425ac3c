"""The gating matrix on real device descriptions, through the project's own decisions.

Each GPU is described by the fields ``torch.cuda.get_device_properties`` returns on it
(a ROCm build answers through ``torch.cuda`` too, naming its ``gfx`` arch in
``gcnArchName``), fed to the real device probe; the verdicts then reach the trial.
"""

import dataclasses
import html
import json
from types import SimpleNamespace

import pytest
import torch

import engine.measure.device as device_mod
from engine.core.config import PRECISIONS, RunConfig
from engine.measure import gating
from engine.measure.device import probe
from engine.record.json_report import read_json
from engine.record.run_record import RunRecord
from engine.report.html import render_html
from engine.report.json_io import write_json
from engine.run.trial import run_trial
from tests.engine.float8_cpu import rowwise_runs_on_cpu

FP8 = ("fp8", "fp8-rowwise", "fp8-rowwise-gw-hp")


def _props(name, major, minor, sms, gcn=None):
    props = SimpleNamespace(name=name, major=major, minor=minor, multi_processor_count=sms,
                            total_memory=80 * 2**30)
    if gcn is not None:
        props.gcnArchName = gcn
    return props


# what torch.cuda.get_device_properties reports on each (ROCm reports MI300X as 9.4)
A100 = _props("NVIDIA A100-SXM4-80GB", 8, 0, 108)
RTX3090 = _props("NVIDIA GeForce RTX 3090", 8, 6, 82)
L4 = _props("NVIDIA L4", 8, 9, 58)
H100 = _props("NVIDIA H100 80GB HBM3", 9, 0, 132)
B200 = _props("NVIDIA B200", 10, 0, 148)
RTX5090 = _props("NVIDIA GeForce RTX 5090", 12, 0, 170)
T4 = _props("Tesla T4", 7, 5, 40)
MI300X = _props("AMD Instinct MI300X", 9, 4, 304, gcn="gfx942:sramecc+:xnack-")
MI355X = _props("AMD Instinct MI355X", 9, 5, 256, gcn="gfx950:sramecc+:xnack-")
MI250X = _props("AMD Instinct MI250X/MI250", 9, 0, 110, gcn="gfx90a:sramecc+:xnack-")


@pytest.fixture
def probe_gpu(monkeypatch):
    """The real ``probe('cuda')`` on a machine whose one GPU reports ``props``."""
    def run(props):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=0: props)
        monkeypatch.setattr(device_mod.torch.version, "cuda",
                            None if hasattr(props, "gcnArchName") else "12.9")
        return probe("cuda")
    return run


# (device, precision, verdict): the compute capability or arch decides, not the name
TABLE = [
    (A100, "fp8", "unsupported"), (A100, "fp8-rowwise", "unsupported"),
    (A100, "bf16-amp", "native"), (A100, "tf32", "native"),
    (RTX3090, "fp8-rowwise-gw-hp", "unsupported"), (RTX3090, "bf16", "native"),
    (L4, "fp8", "native"), (L4, "fp8-rowwise", "native"),
    (H100, "fp8-rowwise", "native"), (H100, "fp8-rowwise-gw-hp", "native"),
    (B200, "fp8-rowwise", "native"), (B200, "tf32", "native"),
    (RTX5090, "fp8", "native"), (RTX5090, "fp8-rowwise-gw-hp", "native"),
    (T4, "bf16-amp", "unsupported"), (T4, "nf4", "unsupported"), (T4, "tf32", "unsupported"),
    (T4, "fp16-amp", "native"), (T4, "fp8", "unsupported"),
    (MI300X, "fp8", "native"), (MI300X, "fp8-rowwise", "native"), (MI300X, "tf32", "native"),
    (MI355X, "fp8-rowwise-gw-hp", "native"), (MI355X, "bf16-amp", "native"),
    (MI250X, "fp8", "unsupported"), (MI250X, "bf16-amp", "native"),
]


@pytest.mark.parametrize(("props", "precision", "support"), TABLE,
                         ids=[f"{p.name}-{r}" for p, r, _ in TABLE])
def test_the_probe_gates_each_recipe_by_what_the_device_is(probe_gpu, props, precision,
                                                           support):
    info = probe_gpu(props)
    verdict = info.verdict(precision)
    assert verdict.support == support, verdict.reason
    # the probe's greying follows the verdict: unsupported, and only that, blocks a run
    assert (info.unsupported_reason(precision) is not None) == (support == "unsupported")
    if support == "unsupported":
        assert info.unsupported_reason(precision) == verdict.reason
    if hasattr(props, "gcnArchName"):
        assert props.gcnArchName.split(":")[0] in verdict.reason
    else:
        assert f"{props.major}.{props.minor}" in verdict.reason


def test_fp8_flavour_on_amd_is_fnuz_on_gfx942_and_ocp_on_gfx950(probe_gpu):
    mi300x = probe_gpu(MI300X).verdict("fp8").reason
    assert "e4m3fnuz" in mi300x and "OCP" not in mi300x
    mi355x = probe_gpu(MI355X).verdict("fp8").reason
    assert "OCP e4m3fn" in mi355x and "fnuz" not in mi355x


def test_flags_the_rest_of_the_app_reads_agree_with_the_verdicts(probe_gpu):
    a100, h100 = probe_gpu(A100), probe_gpu(H100)
    assert a100.bf16_supported and a100.tf32_supported and not a100.fp8_supported
    assert h100.fp8_supported
    t4 = probe_gpu(T4)
    assert not t4.bf16_supported and not t4.tf32_supported


def test_the_cpu_runs_float8_emulated_and_has_no_tf32():
    info = probe("cpu")
    for precision in FP8:
        verdict = info.verdict(precision)
        if precision != "fp8" and not rowwise_runs_on_cpu():
            # torch 2.11's CPU _scaled_mm takes per-tensor scales only
            assert verdict.support == "unsupported" and "per-tensor scales only" in (
                verdict.reason)
            assert info.unsupported_reason(precision) == verdict.reason
            continue
        assert verdict.support == "emulated" and "fp8 matrix unit" in verdict.reason
        assert info.unsupported_reason(precision) is None
    assert info.verdict("tf32").support == "unsupported"
    assert not info.fp8_supported  # the advisor's "fp8 hardware" flag stays off
    assert set(info.verdicts) == set(PRECISIONS)


def test_a_missing_library_overrides_a_native_verdict(probe_gpu, monkeypatch):
    real = device_mod._has
    monkeypatch.setattr(device_mod, "_has", lambda m: m != "torchao" and real(m))
    h100 = probe_gpu(H100)
    for precision in FP8:
        assert h100.verdict(precision).support == "unsupported"
        assert "torchao is not installed" in h100.unsupported_reason(precision)


def _config(**kw):
    return RunConfig(**{**dict(model="tiny", batch_size=1, seq_len=16, steps=1, warmup=0,
                               device="cpu", isolation="inline"), **kw})


def test_each_trial_carries_its_verdict_into_the_report(tmp_path):
    cpu = probe("cpu")
    emulated = run_trial(_config(precisions=("fp8",)), "fp8", cpu, lambda e: None,
                         lambda: False)
    assert emulated.status == "ok", emulated.reason
    assert emulated.support == "emulated" and "fp8 matrix unit" in emulated.support_reason
    assert any(n.startswith("emulated:") for n in emulated.notes)
    blocked = run_trial(_config(precisions=("tf32",)), "tf32", cpu, lambda e: None,
                        lambda: False)
    assert blocked.status == "unsupported"
    assert (blocked.support, blocked.support_reason) == ("unsupported", blocked.reason)
    native = run_trial(_config(precisions=("fp32",)), "fp32", cpu, lambda e: None,
                       lambda: False)
    assert native.support == "native"
    record = RunRecord(run_id="gated", config={"model": "tiny"}, status="ok",
                       trials=[emulated, blocked, native])
    path = tmp_path / "gated.json"
    write_json(record, path)
    back = read_json(path)
    assert [t.support for t in back.trials] == ["emulated", "unsupported", "native"]
    page = render_html(back)
    assert html.escape(f"emulated: {emulated.support_reason}") in page
    assert html.escape(f"native: {native.support_reason}") in page


def test_an_older_report_without_verdicts_still_loads(tmp_path):
    cpu = dataclasses.replace(probe("cpu"), verdicts={}, unsupported={})
    result = run_trial(_config(precisions=("fp32",)), "fp32", cpu, lambda e: None,
                       lambda: False)
    record = RunRecord(run_id="old", config={"model": "tiny"}, status="ok", trials=[result])
    path = tmp_path / "old.json"
    write_json(record, path)
    data = json.loads(path.read_text())
    for trial in data["trials"]:
        del trial["support"], trial["support_reason"]
    path.write_text(json.dumps(data))
    (trial,) = read_json(path).trials
    assert trial.support is None and trial.support_reason is None


def test_gating_rejects_what_it_does_not_know():
    with pytest.raises(ValueError, match="cpu, cuda or rocm"):
        gating.DeviceDescription("tpu", "TPU v5")
    with pytest.raises(ValueError, match="native"):
        gating.Verdict("maybe", "?")
