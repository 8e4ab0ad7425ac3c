"""Four real training clients with AmpScope attached: is every journaled figure theirs?

Runs on the CPU, a few optimizer steps each, with tiny models built from configs (random
weights, random tokens, nothing downloaded), and compares every figure AmpScope journaled
(loss, the lr of every parameter group, the pre-clip gradient norm, tokens, the precision
label, the logged evaluation losses) with the client's own value, taken from the client's
logging or variables, never from AmpScope. Prints one line per client per figure with the
largest difference over the steps; exits 1 if any figure differs, 2 on bad arguments.

The clients (issue #45):
- ``nanogpt``: karpathy/nanoGPT's ``train.py`` run as shipped, from a temporary copy of
  the clone with these lines added (see ``NANOGPT_PATCH``): the Recorder made before the
  loop and finished after it, ``rec.step(loss=loss * gradient_accumulation_steps)`` after
  its logging, ``clip_grad_norm_``'s result kept in a variable, and one JSON line per step
  of its own values (``lossf``, the groups' lr it set, ``tokens_per_iter``, its ``ctx``,
  ``scaler`` and weights' dtype). Its data is written in its own format (``train.bin``,
  ``val.bin``, ``meta.pkl`` of random uint16 tokens); its own defaults stand except the
  sizes, ``grad_clip=0.1`` (every step clips), ``device=cpu`` and ``compile=False``
  (``--compile`` keeps its torch.compile). ``dtype`` is its CPU default, float16: its
  GradScaler disables itself and its ``ctx`` is a nullcontext, so fp32 ran.
- ``accelerate``, ``trainer``, ``dora``: condensed from transformers'
  ``examples/pytorch/language-modeling/run_clm_no_trainer.py`` and ``run_clm.py`` and
  peft's ``examples/dora_finetuning/dora_finetuning.py``; see
  ``benchmarks/real_clients_hf.py`` for what each keeps and changes.

Get the clone (the others are condensed here and need none):

    git clone https://github.com/karpathy/nanoGPT   # followed at 3adf61e1
    python3 benchmarks/real_clients.py --nanogpt nanoGPT [--only nanogpt,trainer] [--compile]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("AMPSCOPE_DATA_DIR", tempfile.mkdtemp(prefix="ampscope-clients-"))

import real_clients_hf  # noqa: E402
from real_clients_hf import precision_label  # noqa: E402

CLIENTS = ("nanogpt", "accelerate", "trainer", "dora")

# (anchor in nanoGPT's train.py, text put in its place); each anchor must occur once
NANOGPT_PATCH = [
    ("raw_model = model.module if ddp else model # unwrap DDP container if needed\n",
     "raw_model = model.module if ddp else model # unwrap DDP container if needed\n"
     "import json, ampscope  # AmpScope: added\n"
     "rec = ampscope.Recorder(model, optimizer, scaler,"
     " journal=os.environ['AMPSCOPE_JOURNAL'])  # AmpScope: added\n"
     "_client = open(os.environ['AMPSCOPE_CLIENT_LOG'], 'w')  # AmpScope: added\n"),
    ("        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)\n",
     "        _norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)"
     "  # AmpScope: result kept\n"),
    ("    iter_num += 1\n    local_iter_num += 1\n",
     "    _client.write(json.dumps(dict(loss=lossf, lr=[g['lr'] for g in optimizer.param_groups],"
     " grad_norm=float(_norm), tokens=tokens_per_iter,"
     " weights=str(next(raw_model.parameters()).dtype).removeprefix('torch.'),"
     " autocast=None if isinstance(ctx, nullcontext) else str(ptdtype).removeprefix('torch.'),"
     " scaled=scaler.is_enabled())) + '\\n')  # AmpScope: added\n"
     "    rec.step(loss=loss * gradient_accumulation_steps)  # AmpScope: added\n"
     "    iter_num += 1\n    local_iter_num += 1\n"),
]
NANOGPT_ARGS = ["--device=cpu", "--compile=False", "--dataset=random", "--n_layer=2",
                "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4",
                "--gradient_accumulation_steps=3", "--max_iters=6", "--eval_interval=4",
                "--eval_iters=2", "--grad_clip=0.1", "--warmup_iters=2", "--lr_decay_iters=6",
                "--min_lr=6e-5"]


def run_nanogpt(clone: Path, work: Path, compile: bool = False) -> tuple[Path, dict]:
    """nanoGPT's train.py, patched as NANOGPT_PATCH says, in a copy under ``work``
    (``compile``: its own default, torch.compile, kept)."""
    import numpy as np

    copy = work / "nanoGPT"
    copy.mkdir()
    for name in ("train.py", "model.py", "configurator.py"):
        shutil.copy(clone / name, copy / name)
    text = (copy / "train.py").read_text()
    for anchor, replacement in NANOGPT_PATCH:
        if text.count(anchor) != 1:
            raise SystemExit(f"nanoGPT's train.py no longer has {anchor.strip()!r} once: "
                             "check out commit 3adf61e1 of the clone")
        text = text.replace(anchor, replacement)
    text += "rec.finish()  # AmpScope: added\n_client.close()  # AmpScope: added\n"
    (copy / "train.py").write_text(text)
    data = copy / "data" / "random"
    data.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", 20000), ("val", 2000)):
        rng.integers(0, 96, n, dtype=np.uint16).tofile(data / f"{split}.bin")
    with open(data / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 96}, f)
    journal, client_log = work / "nanogpt.jsonl", work / "nanogpt-client.jsonl"
    env = dict(os.environ, AMPSCOPE_JOURNAL=str(journal), AMPSCOPE_CLIENT_LOG=str(client_log),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    given = [a for a in NANOGPT_ARGS if not (compile and a == "--compile=False")]
    proc = subprocess.run([sys.executable, "train.py", *given, f"--out_dir={work / 'out'}"],
                          cwd=copy, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"nanoGPT's train.py failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in client_log.read_text().splitlines()]
    return journal, {
        "loss": [r["loss"] for r in rows],
        "lr": [r["lr"] for r in rows],
        "grad_norm": [r["grad_norm"] for r in rows],
        "tokens": [r["tokens"] for r in rows],
        "precision": precision_label(rows[0]["weights"], rows[0]["autocast"], rows[0]["scaled"]),
        "scalars": {},
    }


def differences(journal: Path, client: dict) -> list[tuple[str, int, float | str, bool]]:
    """(figure, values compared, largest difference, equal within float32 rounding)."""
    from engine.record.journal import read_journal

    record = read_journal(journal)
    (trial,) = record.trials
    steps = trial.steps
    out = []

    def numbers(figure, ours, theirs, rel):
        if len(ours) != len(theirs) or any(v is None for v in ours):
            out.append((figure, len(theirs), f"journaled {ours}", False))
            return
        diff = max((abs(a - b) for a, b in zip(ours, theirs)), default=0.0)
        same = all(abs(a - b) <= rel * max(abs(b), 1e-30) for a, b in zip(ours, theirs))
        out.append((figure, len(theirs), diff, same))

    numbers("loss", [s.loss for s in steps], client["loss"], 1e-6)  # float32 rounding
    groups = len(client["lr"][0])
    scalars = {}
    for x in record.scalars:
        scalars.setdefault(x.name, {})[x.step] = x.value
    for g in range(groups):
        ours = ([s.learning_rate for s in steps] if g == 0 else
                [scalars.get(f"lr_group{g}", {}).get(s.step) for s in steps])
        numbers(f"lr group {g}", ours, [lrs[g] for lrs in client["lr"]], 1e-12)
    numbers("grad norm (pre-clip)", [s.grad_norm for s in steps], client["grad_norm"], 1e-6)
    numbers("tokens", [s.tokens for s in steps], client["tokens"], 0.0)
    for name, at_step in client["scalars"].items():  # evaluations the client ran
        journaled = scalars.get(name, {})
        if sorted(journaled) != sorted(at_step):
            out.append((f"{name} (steps)", len(at_step),
                        f"journaled at {sorted(journaled)}, client's {sorted(at_step)}", False))
        else:
            numbers(name, [journaled[k] for k in sorted(at_step)],
                    [at_step[k] for k in sorted(at_step)], 1e-6)
    if "lr_logged" in client:  # the lr the Trainer logged, group 0's
        numbers("lr (Trainer's log)", [s.learning_rate for s in steps], client["lr_logged"],
                1e-12)
    same = trial.precision == client["precision"]
    out.append(("precision", 1, f"none: both {trial.precision}" if same else
                f"journaled {trial.precision}, client ran {client['precision']}", same))
    if len(steps) != len(client["loss"]):
        out.append(("steps", len(client["loss"]), f"journaled {len(steps)}", False))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nanogpt", type=Path, help="a clone of github.com/karpathy/nanoGPT")
    parser.add_argument("--compile", action="store_true",
                        help="keep nanoGPT's torch.compile (its default; slow on a CPU)")
    parser.add_argument("--only", default=",".join(CLIENTS),
                        help=f"comma-separated clients to run, of {', '.join(CLIENTS)}")
    args = parser.parse_args(argv)
    only = [c for c in args.only.split(",") if c]
    unknown = sorted(set(only) - set(CLIENTS))
    if unknown:
        parser.error(f"unknown client {', '.join(unknown)}: choose from {', '.join(CLIENTS)}")
    if "nanogpt" in only and (args.nanogpt is None or not (args.nanogpt / "train.py").is_file()):
        parser.error("--nanogpt must name a nanoGPT clone (git clone "
                     "https://github.com/karpathy/nanoGPT), or leave nanogpt out of --only")
    runners = {"nanogpt": lambda work: run_nanogpt(args.nanogpt.resolve(), work, args.compile),
               "accelerate": real_clients_hf.run_accelerate,
               "trainer": real_clients_hf.run_trainer, "dora": real_clients_hf.run_dora}
    failed = False
    print(f"{'client':<11} {'figure':<22} {'values':>6}  largest difference")
    with tempfile.TemporaryDirectory(prefix="ampscope-clients-") as tmp:
        for name in only:
            work = Path(tmp) / name
            work.mkdir()
            with contextlib.redirect_stdout(sys.stderr):  # the Trainer's own log lines
                journal, client = runners[name](work)
            for figure, count, diff, same in differences(journal, client):
                shown = f"{diff:.3g}" if isinstance(diff, float) else diff
                print(f"{name:<11} {figure:<22} {count:>6}  {shown}{'' if same else '  DIFFERS'}",
                      flush=True)
                failed |= not same
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
