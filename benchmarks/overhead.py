"""Engine overhead: AmpScope's measured tokens/s against a bare training loop.

Same model, precision, optimizer and batches; the bare loop is the few lines a user
would write (autocast, GradScaler, step, zero_grad) timed with CUDA events or
perf_counter and nothing else. Rounds alternate bare / engine so drift on a busy
machine hits both. Prints the ratio measured in this one run; goal: overhead <= 2%.

    python benchmarks/overhead.py                       # tiny on CPU, or gpt2 on a GPU
    python benchmarks/overhead.py --model gpt2 --precision bf16-amp --batch-size 8
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from engine.core.config import RunConfig  # noqa: E402
from engine.core.quiet import quiet_libraries  # noqa: E402
from engine.core.recipes import autocast_for, recipe  # noqa: E402
from engine.measure.device import probe  # noqa: E402
from engine.models.load import load_model, make_batches  # noqa: E402
from engine.run.trial import BATCH_POOL, adam_eps, make_optimizer, make_scaler, run_trial  # noqa: E402


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
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt2" if cuda else "tiny")
    p.add_argument("--precision", default="bf16-amp" if cuda else "fp32")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=512 if cuda else 128)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="auto")
    args = p.parse_args()
    config = RunConfig(model=args.model, precisions=(args.precision,), batch_size=args.batch_size,
                       seq_len=args.seq_len, steps=args.steps, warmup=args.warmup,
                       device=args.device, isolation="inline")
    info = probe(config.device)
    bare, eng = [], []
    for _ in range(args.rounds):
        bare.append(bare_loop(config, info.torch_device))
        eng.append(engine_loop(config, info))
    tokens = config.tokens_per_step
    bare_ms, eng_ms = statistics.median(bare), statistics.median(eng)
    ratio = (tokens / eng_ms) / (tokens / bare_ms)
    print(f"device: {info.describe()}")
    print(f"model {config.model}, {args.precision}, batch {args.batch_size} x {args.seq_len}, "
          f"{args.steps} steps after {args.warmup} warm-up, {args.rounds} alternating rounds")
    print(f"bare loop  median step {bare_ms:9.2f} ms  rounds {[round(x, 2) for x in bare]}")
    print(f"engine     median step {eng_ms:9.2f} ms  rounds {[round(x, 2) for x in eng]}")
    print(f"engine tokens/s / bare tokens/s = {ratio:.4f}  (overhead {100 * (1 - ratio):+.2f}%, "
          "goal <= 2%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
