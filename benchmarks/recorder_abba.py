"""The Recorder's cost per step on a 40 ms CPU step, measured ABBA in one process.

A step is a small GPT-2's forward, backward, clipping and AdamW step plus a data fetch
(a sleep) that fills it to --step-ms, as a loop waiting on its loader does. Blocks of
--steps steps run without (A) and with (B) an ``ampscope.Recorder`` (its monitor thread
on, as by default) in the order A B B A, --rounds times: drift in the machine's speed hits
both sides alike. The first steps of every block are dropped (the Recorder's warm-up and
FLOP-counting steps; the bare loop's are dropped too). Prints, per round, the ratio of the
two blocks' median step times, then the median ratio with its interquartile range, the
cost in ms per step, the time spent inside ``rec.step()`` itself, and the load average:
the goal (cost < 1% of the step) is met only when measured on an idle machine.

    python3 benchmarks/recorder_abba.py [--rounds 8] [--steps 30] [--step-ms 40]
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
os.environ.setdefault("AMPSCOPE_DATA_DIR", tempfile.mkdtemp(prefix="ampscope-abba-"))

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

import ampscope  # noqa: E402

SKIP = 3  # first steps of every block: warm-up, the Recorder's counting step, one more


def make():
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1024,
                                       n_positions=64, bos_token_id=0, eos_token_id=0))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 1024, (2, 64))
    return model, opt, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def compute(model, opt, batch):
    loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def block(model, opt, batch, steps: int, fill_s: float, recorded: bool):
    """Step times (s) of one block, and the time spent inside rec.step() (s) per step."""
    gc.collect()
    rec = ampscope.Recorder(model, opt) if recorded else None
    if rec is not None:
        rec.start()
    times, inside = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        time.sleep(fill_s)  # the loader
        loss = compute(model, opt, batch)
        if rec is not None:
            t1 = time.perf_counter()
            rec.step(loss=loss)
            inside.append(time.perf_counter() - t1)
        times.append(time.perf_counter() - t0)
    if rec is not None:
        rec.finish()
    return times[SKIP:], inside[SKIP:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--step-ms", type=float, default=40.0)
    args = parser.parse_args()
    torch.set_num_threads(1)  # one core: the step's time is not the scheduler's choice
    model, opt, batch = make()
    for _ in range(5):
        compute(model, opt, batch)
    compute_s = statistics.median(
        (lambda t: (compute(model, opt, batch), time.perf_counter() - t)[1])(time.perf_counter())
        for _ in range(10))
    fill_s = max(0.0, args.step_ms / 1e3 - compute_s)
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; step: "
          f"{compute_s * 1e3:.1f} ms compute + {fill_s * 1e3:.1f} ms data fetch (sleep)")
    ratios, costs, inside_all = [], [], []
    for r in range(args.rounds):
        bare, recorded = [], []
        for recorded_block in (False, True, True, False):  # A B B A
            times, inside = block(model, opt, batch, args.steps, fill_s, recorded_block)
            (recorded if recorded_block else bare).extend(times)
            inside_all.extend(inside)
        a, b = statistics.median(bare), statistics.median(recorded)
        ratios.append(b / a)
        costs.append((b - a) * 1e3)
        print(f"round {r}: bare {a * 1e3:.2f} ms, recorded {b * 1e3:.2f} ms, ratio {b / a:.4f}")
    q1, med, q3 = statistics.quantiles(ratios, n=4)
    print(f"with/without: median {med:.4f} (interquartile {q1:.4f}-{q3:.4f}) over "
          f"{args.rounds} ABBA rounds; cost {statistics.median(costs):.2f} ms per step "
          f"({100 * (med - 1):.2f}% of the bare step; goal < 1% of a 40 ms step); "
          f"inside rec.step(): median {statistics.median(inside_all) * 1e3:.3f} ms")
    print(f"load average after: {os.getloadavg()[0]:.2f} (goal < 1% holds only if measured "
          "on an idle machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
