"""Step-time cost of ampscope.Recorder: a loop with it against the same loop without.

Trains the same GPT-2-shaped model (4 layers, 256 wide, batch 4 x 128 tokens) with and
without a Recorder, each side of each round in a fresh process (benchmarks/paired.py: the
order alternates, so drift in the machine's speed hits both), drops the first steps on both
sides (the Recorder's step 1 counts FLOPs and watches memory), and prints the paired ratio
with/without of the rounds' median step times with its 95% interval, and the load average
(measure on an idle machine). Goal: <= 1.02 (<= 1.01 on a GPU). The loop clips gradients
at 1.0 as nanoGPT's train.py does by default (the Recorder reads clip_grad_norm_'s result);
--clip 0 is the worst case, a loop that never computes the norm, so the Recorder measures it itself.

    python benchmarks/recorder_overhead.py [--device cuda] [--rounds 10] [--steps 20] [--clip 1.0]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("AMPSCOPE_DATA_DIR", tempfile.mkdtemp(prefix="ampscope-bench-"))

import torch  # noqa: E402
from paired import load_line, report, rounds  # noqa: E402
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
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--clip", type=float, default=1.0,
                        help="clip_grad_norm_ at this norm, as nanoGPT (0: no clipping)")
    parser.add_argument("--worker", choices=("without", "with"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.worker:  # one side of one round, in this fresh process
        model, opt, batch = make_run(device)
        times = block(model, opt, batch, args.steps, device, args.worker == "with", args.clip)
        print(json.dumps({"ms": statistics.median(times) * 1e3}))
        return
    common = ["--device", args.device, "--steps", str(args.steps), "--clip", str(args.clip)]
    print(f"device {device}, clip {args.clip}, {args.steps} steps per side and round "
          f"({SKIP} dropped); A = without, B = with the Recorder")
    pairs = rounds(__file__, [*common, "--worker", "without"], [*common, "--worker", "with"],
                   args.rounds)
    a = statistics.median(x for x, _ in pairs)
    b = statistics.median(y for _, y in pairs)
    print(f"median step over the rounds: without {a:.2f} ms, with Recorder {b:.2f} ms")
    print(report("step-time ratio with/without", pairs, 1.01 if device.type == "cuda" else 1.02))
    print(load_line())


if __name__ == "__main__":
    main()
