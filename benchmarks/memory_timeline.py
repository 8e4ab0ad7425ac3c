"""What recording the memory timeline costs the memory step.

The timeline lives only in the memory step (``engine.run.trial_untimed.tracked_step``, one untimed
step after the timed ones): the timed steps run no watcher at all, so it adds nothing to
them. Within the memory step, the watcher logs one row per allocation change and thins
the log at the end (engine/measure/memory_timeline.py). This runs the same watched
training step with the log on and off, interleaved (on, off, off, on, ...), and prints
the median time of each, their ratio and its spread over the pairs, plus an unwatched
step for scale and the changes logged.

    OMP_NUM_THREADS=1 python3 benchmarks/memory_timeline.py [--model gpt2] [--batch 4]
        [--seq 256] [--pairs 10] [--checkpointing]

Goal: the timeline adds at most 10% to the memory step (ratio on/off <= 1.10), on an idle
machine (the ratio is measured in one run; nothing else should run beside it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from engine.core.recipes import autocast_for, recipe  # noqa: E402
from engine.measure.memtrack import MemoryWatcher  # noqa: E402
from engine.models.load import load_model, make_batches  # noqa: E402

GOAL = 1.10


def _step(model, optimizer, batch, rec, device, watcher=None) -> None:
    def phase(name: str) -> None:
        if watcher is not None:
            watcher.phase = name

    phase("forward")
    with autocast_for(rec, device):
        loss = model(**batch).loss
    phase("backward")
    loss.backward()
    del loss
    phase("optimizer")
    optimizer.step()
    if watcher is not None:
        watcher.mark("zero_grad")
    optimizer.zero_grad(set_to_none=True)


def _watched(model, optimizer, batch, rec, device, timeline: bool) -> tuple[float, int]:
    watcher = MemoryWatcher(device, timeline=timeline)
    watcher.track_training(model, optimizer, batch)
    start = time.perf_counter()
    with watcher:
        _step(model, optimizer, batch, rec, device, watcher)
    result = watcher.result()  # the timeline is built here: its cost is counted
    seconds = time.perf_counter() - start
    return seconds, result.timeline.changes if result.timeline else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--precision", default="bf16-amp")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--checkpointing", action="store_true")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rec = recipe(args.precision)
    loaded = load_model(args.model, rec, device, 0, False, 8, args.checkpointing)
    model = loaded.model
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    batch = make_batches(loaded.config, loaded.task, args.batch, args.seq, 1, 0, device)[0]
    _step(model, optimizer, batch, rec, device)  # the optimiser state exists from here on

    plain = []
    for _ in range(3):
        start = time.perf_counter()
        _step(model, optimizer, batch, rec, device)
        plain.append(time.perf_counter() - start)
    on, off, changes = [], [], 0
    for i in range(args.pairs):
        order = (True, False) if i % 2 == 0 else (False, True)
        for timeline in order:
            seconds, n = _watched(model, optimizer, batch, rec, device, timeline)
            (on if timeline else off).append(seconds)
            changes = max(changes, n)
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    ratio = statistics.median(on) / statistics.median(off)
    print(f"{args.model} {args.precision} batch {args.batch} x {args.seq} on {device}"
          f"{', gradient checkpointing' if args.checkpointing else ''}")
    print(f"unwatched step: {statistics.median(plain) * 1e3:.1f} ms (median of 3)")
    print(f"memory step, timeline off: {statistics.median(off) * 1e3:.1f} ms; on: "
          f"{statistics.median(on) * 1e3:.1f} ms (medians of {args.pairs}); {changes:,} "
          "allocation changes logged")
    print(f"timeline on / off: {ratio:.3f} (per pair: min {min(ratios):.3f}, max "
          f"{max(ratios):.3f}); goal <= {GOAL:.2f}: {'met' if ratio <= GOAL else 'NOT met'}")


if __name__ == "__main__":
    main()
