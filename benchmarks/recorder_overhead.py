"""Step-time cost of ampscope.Recorder: a loop with it against the same loop without.

Trains the same GPT-2-shaped model (4 layers, 256 wide, batch 4 x 128 tokens) in
alternating blocks with and without a Recorder (ABBA, so drift in the machine's
speed hits both), collects garbage before each block, drops each block's first steps on
both sides (the Recorder's step 1 counts FLOPs and watches memory), and prints the ratio of
the median step times, the spread of the ratio over the block pairs, and the load average
(measure on an idle machine). Goal: <= 1.02. The loop clips gradients at 1.0 as nanoGPT's
train.py does by default (the Recorder reads clip_grad_norm_'s result); --clip 0 is the
worst case, a loop that never computes the norm, so the Recorder measures it itself.

    python benchmarks/recorder_overhead.py [--device cuda] [--blocks 12] [--steps 20] [--clip 1.0]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("AMPSCOPE_DATA_DIR", tempfile.mkdtemp(prefix="ampscope-bench-"))

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

import ampscope  # noqa: E402

SKIP = 2  # first steps of each block: warm-up (and the Recorder's FLOP-counting step)


def make_run(device):
    """The model, its optimizer and one batch, the same on every call."""
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=8192,
                                       n_positions=128)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 8192, (4, 128), device=device)
    return model, opt, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def block(model, opt, batch, steps: int, device, recorder: bool, clip: float) -> list[float]:
    times = []
    gc.collect()  # the previous block's garbage (a finished Recorder's) is not this block's
    rec = ampscope.Recorder(model, opt) if recorder else None
    if rec:
        rec.start()
    for _ in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rec:
            rec.step(loss=loss)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    if rec:
        rec.finish()
    return times[SKIP:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--clip", type=float, default=1.0,
                        help="clip_grad_norm_ at this norm, as nanoGPT (0: no clipping)")
    args = parser.parse_args()
    device = torch.device(args.device)
    model, opt, batch = make_run(device)
    plain, recorded, pairs = [], [], []
    for i in range(args.blocks):  # ABBA: each order equally often, so drift cancels
        medians = {}
        for recorder in ((False, True) if i % 2 == 0 else (True, False)):
            times = block(model, opt, batch, args.steps, device, recorder, args.clip)
            (recorded if recorder else plain).extend(times)
            medians[recorder] = statistics.median(times)
        pairs.append(medians[True] / medians[False])
    a, b = statistics.median(plain), statistics.median(recorded)
    print(f"device {device}, clip {args.clip}, {len(plain)} steps each, median step: without "
          f"{a * 1e3:.2f} ms, with Recorder {b * 1e3:.2f} ms")
    print(f"step-time ratio (with / without): {b / a:.3f}  (goal <= 1.02)")
    low, high = min(pairs), max(pairs)
    print(f"ratio per block pair: median {statistics.median(pairs):.3f}, "
          f"range {low:.3f}..{high:.3f} over {len(pairs)} pairs")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    if load is not None:  # other programs' load makes the ratio meaningless: say it
        print(f"1-minute load average at the end: {load:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
