"""The memory model's error against real CPU trials, per family, shape and recipe.

Runs inline trials of the ten test families (tests/engine/families.py) at every recipe
the CPU runs, at two batch sizes and two sequence lengths, with gradient checkpointing
off and on, and compares engine.models.memory_model's predicted peak with the peak
engine.measure.memtrack measured in the same trial.

    nice python3 scripts/memory_error_table.py --out /tmp/grid.json   # ~15 min on 1 core
    python3 scripts/memory_error_table.py --from /tmp/grid.json       # table only
    python3 scripts/memory_error_table.py --out /tmp/cuda.json --as-cuda --checkpointing off \
        --precisions int8,nf4    # the references the CUDA k-bit term is fitted against

``--out`` keeps each trial's measurement and the predictor's inputs, so ``--from``
re-predicts with the current engine.models.memory_model without training again. Prints the
Markdown table of docs/memory-model.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.core.config import RunConfig  # noqa: E402
from engine.core.recipes import recipe  # noqa: E402
from engine.measure.device import probe  # noqa: E402
from engine.models.load import dims, load_model  # noqa: E402
from engine.models.memory_model import (  # noqa: E402
    CALIBRATION,
    _rerun_kind,
    calibration,
    predict_memory,
    shape_of,
)
from engine.run.as_cuda import as_cuda  # noqa: E402
from engine.run.trial import run_trial  # noqa: E402
from tests.engine.families import FAMILIES  # noqa: E402

PRECISIONS = ("fp32", "fp16-amp", "bf16-amp", "fp16", "bf16", "int8", "nf4")
SHAPES = ((2, 32), (4, 64))  # (batch, sequence)
# from 2**16 the GradScaler skips pure fp16's first steps on some of these models, and a
# skipped step makes no optimiser state: the peak would not be a training step's
INIT_SCALE = 2.0**10
SCORE_TERM_GAIN = 2.0  # percent of the saved bytes a second k-bit LoRA term must win
FLOW_SCORE_GAIN = 1.0  # points of worst error a rerun's score term must win


def measure(out: Path, precisions: tuple[str, ...], families: tuple[str, ...] = tuple(FAMILIES),
            shapes: tuple = SHAPES, checkpointing: tuple = (False, True),
            cuda: bool = False) -> list[dict]:
    """Inline CPU trials; with ``cuda``, each as a CUDA card keeps its tensors
    (engine.run.as_cuda): rows marked device "cuda"."""
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in families:
            folder = Path(tmp) / family
            FAMILIES[family]().save_pretrained(folder)
            for precision in precisions:
                for batch, seq in shapes:
                    for ckpt in checkpointing:
                        config = RunConfig(model=str(folder), batch_size=batch, seq_len=seq,
                                           steps=1, warmup=0, device="cpu",
                                           isolation="inline", grad_checkpointing=ckpt,
                                           profile_step=False, init_scale=INIT_SCALE)
                        with as_cuda() if cuda else nullcontext():
                            result = run_trial(config, precision, probe("cpu"),
                                               lambda e: None, lambda: False)
                        if result.status != "ok":
                            print(family, precision, batch, seq, ckpt, result.reason,
                                  file=sys.stderr)
                            continue
                        mem = result.memory
                        rows.append(dict(family=family, precision=precision, batch=batch,
                                         seq=seq, ckpt=ckpt, measured=mem.total_bytes,
                                         device="cuda" if cuda else "cpu",
                                         phase=mem.peak_phase,
                                         at_phase_start=mem.at_phase_start_bytes))
                        print(family, precision, batch, seq, ckpt, mem.total_bytes,
                              flush=True)
                        out.write_text(json.dumps(rows, indent=0), encoding="utf-8")
    return rows


def shapes_of(rows: list[dict]) -> dict:
    """The memory model's input for each (family, recipe), from the model as trials load it."""
    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        for family, precision in sorted({(r["family"], r["precision"]) for r in rows}):
            folder = Path(tmp) / family
            if not folder.exists():
                FAMILIES[family]().save_pretrained(folder)
            loaded = load_model(str(folder), precision, "cpu")
            found[family, precision] = shape_of(
                loaded.model, getattr(loaded.model, "config", loaded.config),
                dims(loaded.config))
    return found


def table(rows: list[dict], shapes: dict) -> str:
    lines = ["| family | recipe | batch x seq | checkpointing | device | measured B | "
             "predicted B | error |", "|---|---|---|---|---|---:|---:|---:|"]
    worst = 0.0
    for r in rows:
        p = _predicted(r, shapes)
        err = 100 * (p - r["measured"]) / r["measured"]
        worst = max(worst, abs(err))
        lines.append(f"| {r['family']} | {r['precision']} | {r['batch']} x {r['seq']} | "
                     f"{'on' if r['ckpt'] else 'off'} | {_device(r)} | {r['measured']:,} | "
                     f"{p:,} | "
                     f"{err:+.1f}% |")
    lines.append(f"\n{len(rows)} trials; worst |error| {worst:.1f}%")
    return "\n".join(lines)


def gpu_table(reports: list[Path]) -> str:
    """Each finished trial of the GPU reports against the model re-predicted now for its
    device (the report holds the prediction of the day it ran), by the model's shape as a
    plan builds it (engine.run.plan.meta_shape)."""
    from engine.record.json_report import parse_report
    from engine.run.plan import PlanConfig, meta_shape

    lines = ["| report | recipe | batch x seq | measured | predicted | error | "
             "activations' error |", "|---|---|---|---:|---:|---:|---:|"]
    worst = 0.0
    for path in reports:
        record = parse_report(path.read_text(encoding="utf-8"), path.name)
        config = record.config
        for t in record.trials:
            if t.status != "ok" or t.memory is None:
                continue
            shape = meta_shape(PlanConfig(model=config["model"], precisions=(t.precision,)),
                               t.precision)
            p = predict_memory(recipe(t.precision), config["optimizer"], shape,
                               config["batch_size"], config["seq_len"],
                               config["grad_checkpointing"], "cuda")
            m = t.memory
            err = 100 * (p.total_bytes - m.total_bytes) / m.total_bytes
            saved = (m.at_phase_start_bytes or {}).get("backward", {}).get("activations")
            act = f"{100 * (p.activations_bytes - saved) / saved:+.1f}%" if saved else "n/a"
            worst = max(worst, abs(err))
            lines.append(f"| {path.name} | {t.precision} | {config['batch_size']} x "
                         f"{config['seq_len']} | {m.total_bytes / 2**30:.2f} GiB | "
                         f"{p.total_bytes / 2**30:.2f} GiB | {err:+.1f}% | {act} |")
    lines.append(f"\nworst |error| {worst:.1f}%")
    return "\n".join(lines)


def fit_lora(rows: list[dict], shapes: dict, device: str) -> dict:
    """What a k-bit base with LoRA adapters saves beyond the half-autocast calibration (the
    device's), per family and quantisation, from the device's trials without checkpointing
    (what the forward saved, when backward began): bytes per token per adapted input unit,
    least squares. Where the family's rows span several sequence lengths and a second
    term, per token per head x sequence in each layer, brings the worst row within
    SCORE_TERM_GAIN % of its saved bytes closer, the pair."""
    found: dict = {}
    for r in rows:
        rec = recipe(r["precision"])
        shape = shapes[r["family"], r["precision"]]
        if _device(r) != device or not rec.lora or r["ckpt"] or not shape.lora_in_features:
            continue
        bare = dataclasses.replace(shape, lora_in_features=0)
        base = predict_memory(rec, "adamw", bare, r["batch"], r["seq"], False,
                              device).activations_bytes
        measured = r["at_phase_start"]["backward"]["activations"]
        tokens, d = r["batch"] * r["seq"], shape.dims
        layers = d.get("encoder_layers", 0) + d.get("decoder_layers", 0) or d["n_layers"]
        found.setdefault((shape.model_type, rec.quant), []).append(
            (tokens * shape.lora_in_features, tokens * d["n_heads"] * r["seq"] * layers,
             measured - base, measured))
    fitted: dict = {}
    for (family, quant), points in found.items():
        a = np.array([p[:2] for p in points], dtype=float)
        y, saved = np.array([p[2] for p in points]), np.array([p[3] for p in points])
        one = float(np.linalg.lstsq(a[:, :1], y, rcond=None)[0][0])
        worst_one = np.max(np.abs(a[:, 0] * one - y) / saved)
        value: float | list = round(one, 3)
        if len({round(p[1] / p[0], 9) for p in points}) > 1:  # sequence lengths differ
            two = np.linalg.lstsq(a, y, rcond=None)[0]
            worst_two = np.max(np.abs(a @ two - y) / saved)
            if 100 * (worst_one - worst_two) >= SCORE_TERM_GAIN:
                value = [round(float(two[0]), 3), round(float(two[1]), 4)]
        fitted.setdefault(family, {})[quant] = value
    return fitted


def fit_outer(rows: list[dict], shapes: dict) -> dict:
    """Bytes per token per vocabulary unit that a k-bit base with LoRA keeps outside the
    layers beyond the half-autocast calibration, per family and quantisation: from the
    CPU trials with checkpointing, where the layers keep only their inputs (what the
    forward saved, when backward began), the mean."""
    stored = calibration()
    stored["lora_outer"] = {}
    found: dict = {}
    for r in rows:
        rec = recipe(r["precision"])
        shape = shapes[r["family"], r["precision"]]
        if _device(r) != "cpu" or not rec.lora or not r["ckpt"]:
            continue
        predicted = predict_memory(rec, "adamw", shape, r["batch"], r["seq"], True,
                                   "cpu").activations_bytes
        measured = r["at_phase_start"]["backward"]["activations"]
        found.setdefault(shape.model_type, {}).setdefault(rec.quant, []).append(
            (measured - predicted) / (r["batch"] * r["seq"] * shape.dims["vocab"]))
    return {family: {q: round(sum(v) / len(v), 3) for q, v in by.items()}
            for family, by in found.items()}


def fit_flow(rows: list[dict], shapes: dict) -> dict:
    """Per family and rerun kind (engine.models.memory_model._rerun_kind), the rerun term
    (bytes per token per hidden unit) whose worst error over the checkpointed trials is
    least; and a second term, per token per head x sequence (the attention's transient
    score tensors in the rerun), kept where the pair's worst error is FLOW_SCORE_GAIN
    points below the first term's alone."""
    flows = calibration().setdefault("rerun_flow", {})
    groups: dict = {}
    for r in rows:
        if r["ckpt"] and _device(r) == "cpu":
            key = (shapes[r["family"], r["precision"]].model_type,
                   _rerun_kind(recipe(r["precision"])))
            groups.setdefault(key, []).append(r)

    def worst(family, kind, value, group):
        flows.setdefault(family, {})[kind] = value
        return max(abs(_error(r, shapes)) for r in group)

    for (family, kind), group in groups.items():
        alone = min((worst(family, kind, i / 2, group), i / 2) for i in range(241))
        pair = min((worst(family, kind, [i / 2, j / 2], group), [i / 2, j / 2])
                   for j in range(1, 61) for i in range(0, 241, 2))
        flows[family][kind] = pair[1] if pair[0] <= alone[0] - FLOW_SCORE_GAIN else alone[1]
    return flows


def _device(row: dict) -> str:
    """"cpu": a CPU trial; "cuda": a CPU trial as a card keeps its tensors (--as-cuda)."""
    return row.get("device", "cpu")


def _predicted(row: dict, shapes: dict) -> int:
    shape = shapes[row["family"], row["precision"]]
    return predict_memory(recipe(row["precision"]), "adamw", shape, row["batch"], row["seq"],
                          row["ckpt"], _device(row)).total_bytes


def _error(row: dict, shapes: dict) -> float:
    return 100 * (_predicted(row, shapes) - row["measured"]) / row["measured"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="run the trials; keep them here (JSON)")
    parser.add_argument("--from", dest="source", type=Path, nargs="+",
                        help="re-predict kept trials (one file or several)")
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--families", default=",".join(FAMILIES),
                        help="with --out: the families to run (tests/engine/families.py)")
    parser.add_argument("--shapes", default=",".join(f"{b}x{s}" for b, s in SHAPES),
                        help="with --out: batch x sequence, e.g. 4x128,2x32")
    parser.add_argument("--checkpointing", choices=("both", "off", "on"), default="both",
                        help="with --out: gradient checkpointing off, on or both")
    parser.add_argument("--as-cuda", action="store_true",
                        help="with --out: each trial as a CUDA card keeps its tensors "
                             "(engine.run.as_cuda; checkpointing off only)")
    parser.add_argument("--gpu-reports", type=Path, nargs="+",
                        help="JSON reports of GPU runs: their trials against the model "
                             "re-predicted for the device (no trial runs)")
    parser.add_argument("--fit", action="store_true",
                        help="fit the k-bit LoRA activation term and the checkpointed rerun "
                             "term from the trials; write them into "
                             "resources/activation_calibration.json")
    args = parser.parse_args()
    if args.gpu_reports:
        print(gpu_table(args.gpu_reports))
        return
    if args.source:
        rows = [r for f in args.source for r in json.loads(f.read_text(encoding="utf-8"))]
    elif args.out:
        if args.as_cuda and args.checkpointing != "off":
            parser.error("--as-cuda runs without checkpointing: add --checkpointing off")
        shapes = tuple(tuple(int(n) for n in s.split("x")) for s in args.shapes.split(","))
        ckpt = {"both": (False, True), "off": (False,), "on": (True,)}[args.checkpointing]
        rows = measure(args.out, tuple(args.precisions.split(",")),
                       tuple(args.families.split(",")), shapes, ckpt, args.as_cuda)
    else:
        parser.error("pass --out FILE (run the trials) or --from FILE (re-predict)")
    shapes = shapes_of(rows)
    if args.fit:  # the model reads the cached table: refit in it, then store it
        stored = calibration()
        if any(r["ckpt"] and _device(r) == "cpu" for r in rows):
            stored["lora_outer"] = fit_outer(rows, shapes)
        for device, key in (("cpu", "lora_activations"), ("cuda", "lora_activations_cuda")):
            if any(_device(r) == device for r in rows):  # refit the devices these rows hold
                stored[key] = {}
                stored[key] = fit_lora(rows, shapes, device)
        if any(r["ckpt"] for r in rows):
            stored.pop("rerun_flow", None)
            fit_flow(rows, shapes)
        CALIBRATION.write_text(json.dumps(stored, indent=1) + "\n", encoding="utf-8")
    print(table(rows, shapes))


if __name__ == "__main__":
    main()
