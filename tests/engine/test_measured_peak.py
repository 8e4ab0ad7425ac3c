"""MFU against this machine's measured matmul peak (engine.measure.matmul_peak).

The trials run on the CPU, which has no datasheet peak: the measured peak is the MFU
there is. The expected figures are computed here from the cache file the benchmark
wrote and the trial's own FLOPs and step times.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.core.cache_dir import CACHE_DIR_ENV
from engine.core.config import RunConfig
from engine.measure import matmul_peak
from engine.measure.device import probe
from engine.run.trial import run_trial
from tests.cli_in_process import run_cli
from tests.engine.families import FAMILIES

ROOT = Path(__file__).resolve().parents[2]
CPU = probe("cpu")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache folder of the test's own: the first use measures."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(CACHE_DIR_ENV, str(folder))
    return folder / matmul_peak.CACHE_FILE


def _entry(cache_file: Path) -> dict:
    """The one measurement in the cache file, read as JSON (not through the module)."""
    entries = json.loads(cache_file.read_text(encoding="utf-8"))
    (entry,) = [e for e in entries.values() if e["device"] == CPU.name]
    return entry


def _blended(by_dtype: dict, tflops: dict) -> float:
    """Total FLOPs over the time each dtype's share takes at its measured rate."""
    seconds = sum(flops / (tflops[d] * 1e12) for d, flops in by_dtype.items())
    return sum(by_dtype.values()) / seconds


def _folder(tmp_path, family) -> str:
    FAMILIES[family]().save_pretrained(tmp_path / family)  # a config: random weights
    return str(tmp_path / family)


@pytest.mark.parametrize("family,precision", [("gpt2", "fp32"), ("llama-gqa", "bf16-amp")])
def test_mfu_vs_measured_peak_is_model_flops_over_step_time_over_the_measured_rate(
        tmp_path, cache, family, precision):
    config = RunConfig(model=_folder(tmp_path, family), batch_size=2, seq_len=32, steps=3,
                       warmup=1, device="cpu", isolation="inline", profile_step=False)
    events = []
    result = run_trial(config, precision, CPU, events.append, lambda: False)
    assert result.status == "ok", result.reason
    entry = _entry(cache)
    by_dtype = result.flops.by_peak_dtype
    assert by_dtype and set(by_dtype) <= set(entry["tflops"])
    peak = _blended(by_dtype, entry["tflops"])
    model_flops = result.flops.analytic_per_step
    s = result.summary
    assert s.measured_peak_flops == pytest.approx(peak)
    assert s.mfu_measured == pytest.approx(model_flops / (s.median_step_ms / 1e3) / peak)
    for step in result.steps:
        assert step.mfu_measured == pytest.approx(model_flops / (step.step_ms / 1e3) / peak)
    # the datasheet MFU stays n/a on the CPU; the measured one names its source
    assert s.mfu is None and "no datasheet peak for CPUs" in s.mfu_reason
    assert s.mfu_measured_reason is None
    assert "measured matmul peak" in s.measured_peak_source
    dtype = max(by_dtype, key=by_dtype.get)  # the source names the dominant dtype's size
    assert f"{dtype}, best {entry['sizes'][dtype]}x{entry['sizes'][dtype]}" \
        in s.measured_peak_source
    assert "datasheet" not in s.measured_peak_source


def test_the_cache_is_reused_and_measured_again_on_request(tmp_path, cache, monkeypatch):
    measured = []
    real = matmul_peak.measure
    monkeypatch.setattr(matmul_peak, "measure",
                        lambda info, *rest: measured.append(1) or real(info, *rest))
    config = RunConfig(model="tiny", batch_size=1, seq_len=16, steps=1, warmup=0,
                       device="cpu", isolation="inline", profile_step=False)
    first = run_trial(config, "fp32", CPU, lambda e: None, lambda: False)
    stamp = _entry(cache)["measured_at_s"]
    second = run_trial(config, "fp32", CPU, lambda e: None, lambda: False)
    assert len(measured) == 1  # the second trial read the cache
    assert _entry(cache)["measured_at_s"] == stamp
    assert first.summary.measured_peak_source == second.summary.measured_peak_source
    # --measure-peak: the command line (here in this process) measures again and reports
    # the new one
    out = tmp_path / "r.json"
    run = run_cli("profile", "--model", "tiny", "--precision", "fp32", "--batch-size", "1",
                  "--seq-len", "16", "--steps", "1", "--warmup", "0", "--device", "cpu",
                  "--isolation", "inline", "--no-kernel-profile", "--quiet", "--measure-peak",
                  "--out", str(out))
    assert run.returncode == 0, run.stderr
    entry = _entry(cache)
    assert entry["measured_at_s"] > stamp
    summary = json.loads(out.read_text())["trials"][0]["summary"]
    assert summary["measured_peak_flops"] == pytest.approx(entry["tflops"]["fp32"] * 1e12)
    assert summary["mfu_measured"] == pytest.approx(
        summary["tflops"] * 1e12 / summary["measured_peak_flops"])
    assert summary["mfu"] is None
    # the terminal names both denominators
    assert "vs datasheet peak" in run.stdout and "vs measured matmul peak" in run.stdout
    assert "MFU vs datasheet peak n/a: no datasheet peak for CPUs" in run.stdout


def test_the_cache_key_is_the_device_torch_and_on_the_cpu_its_threads(cache):
    assert matmul_peak.cache_key("NVIDIA H100 80GB HBM3", "cuda") == (
        f"NVIDIA H100 80GB HBM3 | torch {torch.__version__}")
    assert matmul_peak.cache_key(CPU.name, "cpu").endswith(
        f"| {torch.get_num_threads()} threads")


def test_a_damaged_cache_is_measured_again(cache):
    cache.parent.mkdir(parents=True)
    cache.write_text("{not json", encoding="utf-8")
    assert matmul_peak.cached(CPU) is None
    peak = matmul_peak.for_device(CPU)
    assert set(peak.tflops) == {"fp32", "bf16", "fp16", "fp8"}  # fp8 by _scaled_mm on a CPU
    assert "TF32" in peak.reasons["tf32"]
    assert matmul_peak.cached(CPU) == peak
    assert matmul_peak.forget(CPU) and matmul_peak.cached(CPU) is None


def test_a_dtype_the_benchmark_does_not_time_says_so(cache):
    lookup = matmul_peak.for_device(CPU).lookup("int8")
    assert lookup.flops_per_s is None
    assert lookup.reason == "no measured int8 matmul peak: the matmul benchmark does not time int8"


def test_report_charts_name_the_denominator(tmp_path, cache):
    from engine.report.charts import mfu_charts
    from tests.engine.sample_record import make_record

    record = make_record()
    titles = [c.title for c in mfu_charts(record)]
    assert titles == ["Model FLOPs utilisation vs datasheet peak"]  # no measured peak in it
    config = RunConfig(model="tiny", batch_size=1, seq_len=16, steps=2, warmup=0,
                       device="cpu", isolation="inline", profile_step=False)
    record.trials = [run_trial(config, "fp32", CPU, lambda e: None, lambda: False)]
    (chart,) = mfu_charts(record)  # the CPU: the measured peak alone, not a datasheet n/a
    assert chart.title == "Model FLOPs utilisation vs measured matmul peak"
    assert chart.svg is not None and "% of measured matmul peak" in chart.svg



def _peak_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "main.py", "peak", "--device", "cpu", *args],
                          cwd=ROOT, capture_output=True, text=True, check=False)


def test_the_peak_command_measures_once_then_reads_the_cache(cache):
    first = _peak_cli("--json")
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    entry = _entry(cache)
    assert not report["cached"] and report["measured_at_s"] == entry["measured_at_s"]
    rows = {r["dtype"]: r for r in report["rows"]}
    assert rows["fp32"]["measured_tflops"] == pytest.approx(entry["tflops"]["fp32"])
    assert rows["fp32"]["datasheet_tflops"] is None
    assert "no datasheet peak for CPUs" in rows["fp32"]["datasheet_reason"]
    second = run_cli("peak", "--device", "cpu")  # the first was the spawned process's
    assert second.returncode == 0, second.stderr
    assert "(cached; --rerun measures again)" in second.stdout
    assert _entry(cache)["measured_at_s"] == entry["measured_at_s"]
    header = next(line for line in second.stdout.splitlines() if line.startswith("dtype"))
    assert header.split("  ")[0] == "dtype" and "measured / datasheet" in header


def test_the_peak_command_sets_a_gpus_datasheet_row_beside_the_measured_one():
    import dataclasses

    from engine.cli.peak import _rows
    from engine.measure.peaks import table

    h100 = dataclasses.replace(CPU, kind="cuda", index=0, name="NVIDIA H100 80GB HBM3",
                               sm_count=132)
    measured = matmul_peak.MeasuredPeak(key="k", device=h100.name, torch_version="t",
                                        sizes={"bf16": 8192}, measured_at_s=0.0,
                                        tflops={"bf16": 700.0}, reasons={})
    rows = {r["dtype"]: r for r in _rows(h100, measured)}
    row = next(g for g in table()["gpus"] if g["name"] == "NVIDIA H100 SXM5")
    assert rows["bf16"]["datasheet_tflops"] == pytest.approx(row["peak_tflops"]["bf16"])
    assert rows["bf16"]["measured_tflops"] == 700.0
    assert rows["fp8"]["measured_tflops"] is None and rows["fp8"]["datasheet_tflops"]


def test_a_matmul_that_ran_out_of_memory_is_not_cached(cache, monkeypatch):
    real_mm = torch.mm

    def out_of_memory(a, b):  # what torch raises when another process holds the memory
        if a.dtype == torch.bfloat16:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 128.00 MiB")
        return real_mm(a, b)

    monkeypatch.setattr(torch, "mm", out_of_memory)
    peak = matmul_peak.for_device(CPU)
    assert peak.failed == ["bf16"] and "OutOfMemoryError" in peak.reasons["bf16"]
    assert "fp32" in peak.tflops and not cache.exists()
    monkeypatch.setattr(torch, "mm", real_mm)
    assert matmul_peak.for_device(CPU).failed == [] and matmul_peak.cached(CPU) is not None


def test_a_slow_dtype_stops_growing_at_the_size_its_budget_can_time(cache, monkeypatch):
    """The ladder doubles the size only while one call takes under a tenth of the budget: a
    16384-wide matmul would take minutes on this CPU (hours in emulated bf16), so reaching
    the end of this measurement at all says the ladder stopped."""
    monkeypatch.setitem(matmul_peak.SIZE, "cpu", 16384)
    measured = matmul_peak.measure(CPU)
    assert measured.tflops and set(measured.sizes) == set(measured.tflops)
    for dtype, n in measured.sizes.items():
        assert n < 16384 and n >= matmul_peak.SMALLEST and n & (n - 1) == 0, (dtype, n)


def test_a_peak_measured_under_load_that_a_run_beats_is_measured_again(cache):
    """A cached fp32 peak of 1 MFLOP/s, as if taken on a machine busy with other work: the
    first measured step beats it, the trial measures again, keeps the best of both, and no
    MFU above 100% is shown."""
    key = matmul_peak.cache_key(CPU.name, CPU.kind)
    slow = {"key": key, "device": CPU.name, "torch_version": torch.__version__,
            "sizes": {"fp32": 256}, "measured_at_s": 1.0, "tflops": {"fp32": 1e-6},
            "reasons": {}, "failed": [], "load_avg_1m": 9.5, "cpu_count": 2}
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({key: slow}), encoding="utf-8")
    assert "busy: the peak may be low" in matmul_peak.cached(CPU).lookup("fp32").source
    config = RunConfig(model="tiny", batch_size=1, seq_len=16, steps=2, warmup=1,
                       device="cpu", isolation="inline", profile_step=False)
    events = []
    result = run_trial(config, "fp32", CPU, events.append, lambda: False)
    assert result.status == "ok", result.reason
    warned = [e.message for e in events if getattr(e, "level", "") == "warning"
              and "beat the measured matmul peak" in e.message]
    assert len(warned) == 1 and "a fp32 step reached" in warned[0]
    entry = _entry(cache)
    assert entry["tflops"]["fp32"] > 1e-6  # measured again: the best of old and new
    assert entry["remeasured_because"].startswith("a fp32 step reached")
    assert entry["load_avg_1m"] is not None and entry["cpu_count"] >= 1
    s = result.summary
    assert s.measured_peak_flops == pytest.approx(
        _blended(result.flops.by_peak_dtype, entry["tflops"]))
    assert "measured again: a fp32 step reached" in s.measured_peak_source
    assert "under a load average of" in s.measured_peak_source
    shown = [st.mfu_measured for st in result.steps if st.mfu_measured is not None]
    assert all(v <= 1.0 for v in shown)
    assert s.mfu_measured is None and s.mfu_measured_reason.startswith(
        "n/a: this run beat the measured matmul peak") or 0 < s.mfu_measured <= 1.0


def test_an_mfu_above_one_is_never_a_figure():
    from engine.measure.peaks import OVER_PEAK_REASON, PeakLookup
    from engine.record.summary import summarise
    from tests.engine.verdict_records import trial

    steps = trial("fp32", 100.0, 1, 3.0).steps  # 100 ms steps
    low = PeakLookup(1e9, "a peak measured under load", None)  # 1 GFLOP/s
    s = summarise(steps, tokens_per_step=512, model_flops_per_step=1e9,
                  counted_flops_per_step=None, peak=None, measured_peak=low)
    assert s.tflops * 1e12 > low.flops_per_s  # 10 GFLOP/s achieved: 1000% of that peak
    assert s.mfu_measured is None and s.mfu_measured_reason == OVER_PEAK_REASON


def test_a_dtype_whose_remeasure_fails_keeps_its_earlier_rate_with_the_reason(
        cache, monkeypatch):
    """Measured again beside a trial's model, a dtype can run out of memory: its earlier rate
    stays (a trial's MFU vs measured peak must not turn n/a), says why it was not renewed, and
    the merged entry is cached, so the next trial does not measure again for that."""
    key = matmul_peak.cache_key(CPU.name, CPU.kind)
    slow = {"key": key, "device": CPU.name, "torch_version": torch.__version__,
            "sizes": {"fp32": 256, "bf16": 256}, "measured_at_s": 1.0,
            "tflops": {"fp32": 1e-6, "bf16": 2e-6}, "reasons": {}, "failed": []}
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({key: slow}), encoding="utf-8")
    real_mm = torch.mm

    def out_of_memory(a, b):
        if a.dtype == torch.bfloat16:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 128.00 MiB")
        return real_mm(a, b)

    monkeypatch.setattr(torch, "mm", out_of_memory)
    peak = matmul_peak.remeasure(CPU, "a bf16-amp step reached 140% of it")
    assert peak.tflops["bf16"] == 2e-6 and peak.sizes["bf16"] == 256
    assert peak.tflops["fp32"] > 1e-6 and peak.failed == []
    found = peak.lookup("bf16")
    assert found.flops_per_s == pytest.approx(2e6) and found.reason is None
    assert "measuring it again failed" in found.source and "OutOfMemoryError" in found.source
    entry = _entry(cache)
    assert entry["tflops"]["bf16"] == 2e-6 and entry["tflops"]["fp32"] > 1e-6
    assert "OutOfMemoryError" in entry["kept"]["bf16"]
    assert matmul_peak.cached(CPU).lookup("bf16").flops_per_s == pytest.approx(2e6)
