"""Engine overhead: AmpScope's median step time against a bare training loop's.

Same model, precision, optimizer and batches; the bare loop is the few lines a user
would write (autocast, GradScaler, step, zero_grad) timed with CUDA events or
perf_counter and nothing else. Every round runs each side in a fresh process (state one
leaves, such as a trial's untimed tail, never reaches the other), the order alternating,
and the figure is the paired ratio engine/bare of the rounds' median step times with its
95% interval (benchmarks/paired.py). Goal: <= 1.01 on a GPU, <= 1.02 on the CPU.

    python benchmarks/overhead.py                       # tiny on CPU, or gpt2 on a GPU
    python benchmarks/overhead.py --model gpt2 --precision bf16-amp --batch-size 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from paired import load_line, report, rounds  # noqa: E402

from engine.core.config import RunConfig  # noqa: E402
from engine.core.quiet import quiet_libraries  # noqa: E402
from engine.core.recipes import autocast_for, recipe  # noqa: E402
from engine.measure.device import probe  # noqa: E402
from engine.models.load import load_model, make_batches  # noqa: E402
from engine.models.optimizers import adam_eps, make_optimizer  # noqa: E402
from engine.models.training_data import BATCH_POOL  # noqa: E402
from engine.run.trial import run_trial  # noqa: E402
from engine.run.trial_setup import make_scaler  # noqa: E402


def bare_loop(config: RunConfig, device: torch.device) -> float:
    """Median ms per step of a hand-written loop over the engine's batches."""
    rec = recipe(config.precisions[0])
    torch.manual_seed(config.seed)
    loaded = load_model(config.model, rec, device, config.seed, lora_r=config.lora_r)
    model = loaded.model
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(config.optimizer, params, config.lr, adam_eps(params),
                         fused=device.type == "cuda")  # as the engine builds it
    scaler = make_scaler(rec, device, config)
    total = config.warmup + config.steps
    batches = make_batches(loaded.config, loaded.task, config.batch_size, config.seq_len,
                           min(BATCH_POOL, total), config.seed, device)
    times = []
    for i in range(total):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            t0 = time.perf_counter()
        with autocast_for(rec, device):
            loss = model(**batches[i % len(batches)]).loss
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            ms = (time.perf_counter() - t0) * 1e3
        if i >= config.warmup:
            times.append(ms)
    return statistics.median(times)


def engine_loop(config: RunConfig, info) -> float:
    result = run_trial(config, config.precisions[0], info, lambda e: None, lambda: False)
    if result.status != "ok":
        raise SystemExit(f"engine trial ended {result.status}: {result.reason}")
    return result.summary.median_step_ms


def main() -> int:
    quiet_libraries()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="default: gpt2 on a GPU, tiny on the CPU")
    p.add_argument("--precision", default=None, help="default: bf16-amp on a GPU, fp32")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=None, help="default: 512 on a GPU, 128")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--device", default="auto")
    p.add_argument("--worker", choices=("bare", "engine"), help=argparse.SUPPRESS)
    args = p.parse_args()
    info = probe(args.device)
    cuda = info.kind == "cuda"
    model = args.model or ("gpt2" if cuda else "tiny")
    precision = args.precision or ("bf16-amp" if cuda else "fp32")
    seq_len = args.seq_len or (512 if cuda else 128)
    config = RunConfig(model=model, precisions=(precision,), batch_size=args.batch_size,
                       seq_len=seq_len, steps=args.steps, warmup=args.warmup,
                       device=args.device, isolation="inline", profile_step=False)
    if args.worker:  # one side of one round, in this fresh process
        ms = (bare_loop(config, info.torch_device) if args.worker == "bare"
              else engine_loop(config, info))
        print(json.dumps({"ms": ms}))
        return 0
    common = ["--model", model, "--precision", precision, "--batch-size", str(args.batch_size),
              "--seq-len", str(seq_len), "--steps", str(args.steps), "--warmup",
              str(args.warmup), "--device", args.device]
    print(f"device: {info.describe()}")
    print(f"model {model}, {precision}, batch {args.batch_size} x {seq_len}, {args.steps} "
          f"steps after {args.warmup} warm-up; A = bare loop, B = engine")
    pairs = rounds(__file__, [*common, "--worker", "bare"], [*common, "--worker", "engine"],
                   args.rounds)
    bare = statistics.median(a for a, _ in pairs)
    eng = statistics.median(b for _, b in pairs)
    print(f"median step over the rounds: bare {bare:.2f} ms, engine {eng:.2f} ms")
    print(report("engine/bare step time", pairs, 1.01 if cuda else 1.02))
    print(load_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
