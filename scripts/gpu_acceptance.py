"""One-command acceptance run of the CUDA path: every check with its expected band.

    python3 scripts/gpu_acceptance.py [--out docs/results]

On a CUDA machine it runs the real engine (each trial in its own process, as the CLI
does) and writes ``<out>/<gpu-name>-acceptance.md``: the environment, then each check
with its expected band, the measured figure and pass/fail. It is sized to finish in
under 8 minutes on one H100. Exit status 1 when a check fails. On a machine without
CUDA it prints one line saying nothing was run and exits 0.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SWEEP = ("fp32", "tf32", "fp16-amp", "bf16-amp", "fp16", "bf16")
MFU_BAND = (0.10, 0.80)  # below: host-bound or mistimed; above: beyond GPT-2 small
TF32_MIN_SPEEDUP = 2.5
TIMER_BAND = (1.00, 1.10)
FLOPS_RATIO_BAND = (0.97, 1.05)


@dataclass
class Check:
    name: str
    expected: str
    measured: str
    passed: bool | None  # None: not applicable on this machine


def _fmt(value, spec: str = ".3g") -> str:
    return "n/a" if value is None else format(value, spec)


def _in(value, band) -> bool:
    return value is not None and band[0] <= value <= band[1]


def _run(**kw):
    from engine.config import RunConfig
    from engine.runner import Runner

    base = dict(model="gpt2", batch_size=8, seq_len=1024, steps=8, warmup=2, device="cuda",
                isolation="process")
    base.update(kw)
    t0 = time.perf_counter()
    record = Runner(RunConfig(**base)).run()
    print(f"  {base['model']} {','.join(base['precisions'])} on {base['device']}: "
          f"{time.perf_counter() - t0:.0f} s "
          f"({', '.join(f'{t.precision} {t.status}' for t in record.trials)})", flush=True)
    return record


def _trial(record, precision):
    return record.trial(precision)


def _median_mfu(trial):
    return trial.summary.mfu if trial and trial.summary else None


def sweep_checks(record) -> list[Check]:
    trials = {p: _trial(record, p) for p in SWEEP}
    ok = {p: t for p, t in trials.items() if t and t.status == "ok"}
    checks = [Check("GPT-2 124M, batch 8 x 1024: every recipe runs", "status ok for "
                    + ", ".join(SWEEP),
                    ", ".join(f"{p} {t.status if t else 'missing'}" for p, t in trials.items()),
                    len(ok) == len(SWEEP))]
    counted = {p: t.flops.counted_per_step for p, t in ok.items() if t.flops}
    checks.append(Check("counted FLOPs identical across recipes", "one value for all",
                        ", ".join(f"{p} {_fmt(v, '.4e')}" for p, v in counted.items()),
                        len(set(counted.values())) == 1 and len(counted) == len(SWEEP)))
    bf16 = _median_mfu(ok.get("bf16-amp"))
    checks.append(Check("bf16-amp MFU, eager", f"{MFU_BAND[0]:.2f}-{MFU_BAND[1]:.2f}",
                        _fmt(bf16), _in(bf16, MFU_BAND)))
    fp32, tf32 = ok.get("fp32"), ok.get("tf32")
    speedup = (fp32.summary.median_step_ms / tf32.summary.median_step_ms
               if fp32 and tf32 and tf32.summary.median_step_ms else None)
    checks.append(Check("tf32 speed-up over fp32 (median step time)",
                        f">= {TF32_MIN_SPEEDUP}x", _fmt(speedup, ".2f") + "x",
                        speedup is not None and speedup >= TF32_MIN_SPEEDUP))
    worst = max((s.mfu for t in ok.values() for s in t.steps if s.mfu is not None),
                default=None)
    checks.append(Check("no MFU above 1 (any step of any recipe)", "<= 1", _fmt(worst),
                        worst is not None and worst <= 1))
    return checks


def timer_check(record, label: str) -> Check:
    """Median CUDA-event step time against the wall-clock gap between step read-backs."""
    trial = _trial(record, "bf16-amp")
    measured = [s for s in trial.steps if not s.warmup] if trial else []
    if len(measured) < 3:
        return Check(f"CUDA-event step time vs wall clock ({label})", "1.00-1.10",
                     "too few steps", False)
    gaps = [b.time_s - a.time_s for a, b in zip(measured, measured[1:])]
    event_ms = statistics.median(s.step_ms for s in measured)
    ratio = statistics.median(gaps) * 1e3 / event_ms
    return Check(f"wall clock between steps / CUDA-event step time ({label})",
                 f"{TIMER_BAND[0]:.2f}-{TIMER_BAND[1]:.2f}",
                 f"{ratio:.3f} (event {event_ms:.2f} ms)", _in(ratio, TIMER_BAND))


def nvml_check(record) -> list[Check]:
    samples = [m for m in record.monitor_samples if m.source == "nvml"]
    fields = ("gpu_util_pct", "gpu_mem_used_bytes", "power_w", "energy_j")
    filled = {f: sum(getattr(m, f) is not None for m in samples) for f in fields}
    found = [m for m in samples if m.process_mem_bytes]
    trial = _trial(record, "bf16-amp")
    mem = trial.memory if trial else None
    methods = sorted({m.process_mem_method for m in found})
    return [
        Check("NVML samples non-null", "every field filled in every sample",
              f"{len(samples)} samples; " + ", ".join(f"{f} {n}" for f, n in filled.items()),
              bool(samples) and all(n == len(samples) for n in filled.values())),
        Check("NVML finds the trial process's memory", "process memory > 0 in samples and "
              "in the trial's memory breakdown",
              f"{len(found)} samples ({'; '.join(methods) or 'none'}); trial "
              f"{_fmt(mem.nvml_process_bytes if mem else None)} B, context gap "
              f"{_fmt(mem.context_gap_bytes if mem else None)} B",
              bool(found) and bool(mem and mem.nvml_process_bytes)),
    ]


def compiled_check(record) -> Check:
    trial = _trial(record, "bf16-amp")
    value = _median_mfu(trial) if trial and trial.status == "ok" else None
    return Check("bf16-amp MFU, compiled", f"{MFU_BAND[0]:.2f}-{MFU_BAND[1]:.2f}",
                 _fmt(value) if trial and trial.status == "ok"
                 else f"{trial.status}: {trial.reason}", _in(value, MFU_BAND))


def quantised_checks(record) -> list[Check]:
    checks = []
    for p in ("int8", "nf4"):
        t = _trial(record, p)
        ratio = (t.flops.counted_per_step / t.flops.analytic_per_step
                 if t and t.status == "ok" and t.flops and t.flops.counted_per_step else None)
        measured = (f"{t.status}, counted/analytic {_fmt(ratio, '.3f')}" if t
                    else "missing")
        if t and t.status != "ok":
            measured += f" ({t.reason})"
        checks.append(Check(f"{p} trains; counted/analytic FLOPs",
                            f"ok, {FLOPS_RATIO_BAND[0]}-{FLOPS_RATIO_BAND[1]}", measured,
                            _in(ratio, FLOPS_RATIO_BAND)))
    return checks


def fp8_checks(info) -> list[Check]:
    if info.unsupported_reason("fp8"):
        return [Check("fp8 eager and compiled", "ok (compute capability 8.9+)",
                      f"unsupported: {info.unsupported_reason('fp8')}", None)]
    checks = []
    for label, warmup in (("eager", 0), ("compiled", 2)):
        t = _trial(_run(precisions=("fp8",), warmup=warmup, steps=4), "fp8")
        eager_label = "NOT representative" in t.recipe
        median = t.summary.median_step_ms if t.summary else None
        measured = f"{t.status}, median {_fmt(median, '.2f')} ms, MFU {_fmt(_median_mfu(t))}"
        if t.reason:
            measured += f" ({t.reason})"
        expected = "ok" + (", labelled not representative" if warmup == 0 else "")
        checks.append(Check(f"fp8 {label}", expected, measured,
                            t.status == "ok" and eager_label == (warmup == 0)))
    return checks


def oom_then_ok() -> Check:
    oom = _run(model="gpt2-xl", precisions=("fp32",), batch_size=128, seq_len=1024, steps=1,
               warmup=0)
    ok = _run(model="gpt2", precisions=("fp32",), batch_size=2, seq_len=128, steps=2, warmup=1)
    a, b = oom.trials[0], ok.trials[0]
    return Check("gpt2-xl fp32 at batch 128 x 1024 runs out of memory, the next trial runs",
                 "oom, then ok", f"{a.status} ({a.reason}), then {b.status}",
                 a.status == "oom" and b.status == "ok")


def sticky_error_then_ok() -> Check:
    # a masked LM whose mask token lies outside its vocabulary: the embedding lookup trips
    # a device-side assert in the trial process
    config = {"model_type": "bert", "architectures": ["BertForMaskedLM"], "vocab_size": 512,
              "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
              "intermediate_size": 128, "max_position_embeddings": 64,
              "mask_token_id": 100000}
    with tempfile.TemporaryDirectory(prefix="ampscope-assert-") as folder:
        (Path(folder) / "config.json").write_text(json.dumps(config), encoding="utf-8")
        bad = _run(model=folder, precisions=("fp32",), batch_size=2, seq_len=32, steps=2,
                   warmup=1)
    ok = _run(model="gpt2", precisions=("fp32",), batch_size=2, seq_len=128, steps=2, warmup=1)
    a, b = bad.trials[0], ok.trials[0]
    return Check("a device-side assert in a trial process is that trial's error; the next "
                 "trial runs", "error naming the assert, then ok",
                 f"{a.status} ({a.reason}), then {b.status}",
                 a.status == "error" and b.status == "ok")


def second_gpu(torch) -> list[Check]:
    if torch.cuda.device_count() < 2:
        return [Check("--device cuda:1", "timed and measured on GPU 1", "one GPU here", None)]
    record = _run(precisions=("bf16-amp",), device="cuda:1")
    return [timer_check(record, "cuda:1")]


def _sweep_group(record) -> list[Check]:
    return [*sweep_checks(record), timer_check(record, "cuda:0, bf16-amp"),
            *nvml_check(record)]


def environment_lines(info, started: str, seconds: float) -> list[str]:
    from engine.environment import collect

    env = collect(info)
    libs = ", ".join(f"{k} {v}" for k, v in env["libraries"].items() if v)
    return [
        f"- GPU: {info.describe()}, {info.sm_count} SMs"
        + (" (a MIG slice)" if info.mig else ""),
        f"- memory: {info.total_memory_bytes / 2**30:.1f} GiB; driver {info.driver_version}; "
        f"CUDA (torch) {env['torch_cuda']}",
        f"- power: {info.power_method}",
        f"- Python {env['python']} on {env['platform']}",
        f"- libraries: {libs}",
        f"- started {started} UTC, took {seconds / 60:.1f} min",
        "- command: python3 scripts/gpu_acceptance.py",
    ]


def write_report(out_dir: Path, info, checks: list[Check], env_lines: list[str]) -> Path:
    slug = re.sub(r"[^a-z0-9]+", "-", info.name.lower()).strip("-")
    path = out_dir / f"{slug}-acceptance.md"
    verdict = {True: "pass", False: "FAIL", None: "n/a"}
    lines = [f"# GPU acceptance: {info.name}", "", "## Environment", "", *env_lines, "",
             "## Checks", "", "| check | expected | measured | result |", "|---|---|---|---|"]
    for c in checks:
        cells = (c.name, c.expected, c.measured, verdict[c.passed])
        lines.append("| " + " | ".join(x.replace("|", "/").replace("\n", " ") for x in cells)
                     + " |")
    failed = sum(c.passed is False for c in checks)
    lines += ["", f"{len(checks)} checks: {sum(c.passed is True for c in checks)} passed, "
              f"{failed} failed, {sum(c.passed is None for c in checks)} not applicable here.",
              ""]
    out_dir.mkdir(parents=True, exist_ok=True)
    from engine.report.atomic import atomic_write

    text = "\n".join(lines)
    return atomic_write(path, lambda fh: fh.write(text))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "results"),
                        help="folder for <gpu-name>-acceptance.md")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        from engine.device import cuda_unavailable_reason

        print(f"gpu_acceptance: no usable CUDA GPU ({cuda_unavailable_reason()}): nothing "
              "was run and no results file was written")
        return 0
    from engine.device import probe
    from engine.quiet import quiet_libraries

    quiet_libraries()
    started, t0 = time.strftime("%Y-%m-%d %H:%M", time.gmtime()), time.perf_counter()
    info = probe("cuda")
    print(f"GPU acceptance on {info.describe()}", flush=True)
    groups = [
        ("recipe sweep, timer and NVML", lambda: _sweep_group(_run(precisions=SWEEP))),
        ("bf16-amp compiled", lambda: [compiled_check(_run(precisions=("bf16-amp",),
                                                           compile=True))]),
        ("--device cuda:1", lambda: second_gpu(torch)),
        ("int8 and nf4", lambda: quantised_checks(_run(precisions=("int8", "nf4"),
                                                       batch_size=4, seq_len=256, steps=3))),
        ("fp8", lambda: fp8_checks(info)),
        ("OOM then ok", lambda: [oom_then_ok()]),
        ("device-side assert then ok", lambda: [sticky_error_then_ok()]),
    ]
    checks = []
    for name, group in groups:
        try:
            checks += group()
        except Exception as exc:  # one broken group must not lose the others' results
            checks.append(Check(name, "runs", f"the check itself failed: "
                                f"{type(exc).__name__}: {exc}", False))
    seconds = time.perf_counter() - t0
    checks.append(Check("the whole acceptance run", "< 8 min on one H100",
                        f"{seconds / 60:.1f} min", seconds < 480 if "H100" in info.name
                        else None))
    path = write_report(Path(args.out), info, checks, environment_lines(info, started, seconds))
    failed = [c.name for c in checks if c.passed is False]
    print(f"wrote {path}: {len(failed)} failed" + (f" ({'; '.join(failed)})" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
