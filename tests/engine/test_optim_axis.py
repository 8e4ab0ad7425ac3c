"""Optimizer state precision as its own axis: ``RECIPE+OPTIM`` trials side by side.

Every byte figure is checked against a count written here: the storages the optimiser's
state really holds (torchao's state subclasses opened by their own fields), or the
parameters' shapes with the libraries' documented layouts.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.core.config import RunConfig, parse_precisions
from engine.measure.device import probe
from engine.models.load import load_config, resolve_source
from engine.run import trial_setup, trial_untimed
from engine.run.plan import PlanConfig
from engine.run.trial import run_trial
from tests.engine.families import FAMILIES

ROOT = Path(__file__).resolve().parents[2]
CPU = probe("cpu")
CHOICES = ["adamw", "sgd", "adamw8bit", "adamw8bit-ao", "adamw4bit", "adamw-fp8",
           "adamw-bf16-sr"]


def test_recipe_plus_optimizer_names_parse_and_keep_their_order():
    text = "fp32, BF16-AMP+adamw8bit ,bf16+adamw-bf16-sr,fp32+adamw4bit,fp32+adamw-fp8"
    assert parse_precisions(text) == ("fp32", "bf16-amp+adamw8bit", "bf16+adamw-bf16-sr",
                                      "fp32+adamw4bit", "fp32+adamw-fp8")
    # the reduction suffix of distributed trials still parses and runs
    ddp = RunConfig(precisions="fp32@bf16,bf16-amp", strategy="ddp", nproc_per_node=2)
    assert ddp.precisions == ("fp32@bf16", "bf16-amp")


@pytest.mark.parametrize("text, says", [
    ("fp32+adam", ["unknown optimizer '+adam'", *CHOICES]),
    ("fp32+", ["unknown optimizer '+'", *CHOICES]),
    ("fp33+adamw8bit", ["unknown precision 'fp33'", "fp32", "bf16-amp", "nf4"]),
    ("fp32+adamw8bit,fp32+adamw8bit", ["listed twice"]),
])
def test_bad_names_are_refused_naming_the_choices(text, says):
    with pytest.raises(ValueError) as err:
        parse_precisions(text)
    assert all(s in str(err.value) for s in says), str(err.value)


def test_refused_combinations_say_why():
    with pytest.raises(ValueError, match="one process only"):
        RunConfig(precisions="fp32+adamw8bit", strategy="fsdp2", nproc_per_node=2)
    # plan traces each label's own optimizer; a reduction dtype needs a strategy
    assert PlanConfig(model="tiny", precisions=("fp32", "fp32+adamw4bit")).precisions == (
        "fp32", "fp32+adamw4bit")
    with pytest.raises(ValueError, match="needs a distributed run"):
        PlanConfig(model="tiny", precisions=("fp32@bf16",))
    with pytest.raises(ValueError, match="one process only"):
        PlanConfig(model="tiny", precisions=("fp32+adamw4bit",), strategy="fsdp2",
                   nproc_per_node=2)


def _cli(*args, timeout=600):
    return subprocess.run([sys.executable, "main.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_a_bad_optimizer_suffix_exits_2_from_the_cli(tmp_path):
    out = tmp_path / "r.json"
    run = _cli("profile", "--model", "tiny", "--precision", "fp32,fp32+adamw9bit",
               "--device", "cpu", "--isolation", "inline", "--out", str(out), timeout=120)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "adamw9bit" in lines[0]
    assert all(c in lines[0] for c in CHOICES), lines[0]
    assert not out.exists()
    helped = _cli("profile", "--help", timeout=120)
    assert "RECIPE+OPTIM" in helped.stdout.replace("\n", " ")
    assert any(line.startswith("  +adamw4bit ") for line in helped.stdout.splitlines())


def _tiny_sizes() -> list[int]:
    config, _ = load_config(resolve_source("tiny"))
    model = AutoModelForCausalLM.from_config(config)  # tied lm_head: listed once
    return [p.numel() for p in model.parameters()]


def test_inline_cli_run_compares_optimizer_states_side_by_side(tmp_path):
    out = tmp_path / "r.json"
    run = _cli("profile", "--model", "tiny", "--precision",
               "fp32,fp32+adamw8bit,bf16-amp+adamw-bf16-sr", "--device", "cpu",
               "--isolation", "inline", "--batch-size", "2", "--seq-len", "32", "--steps", "2",
               "--warmup", "1", "--no-kernel-profile", "--interleave", "off",
               "--out", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    trials = {t["precision"]: t for t in report["trials"]}
    assert all(t["status"] == "ok" for t in trials.values()), trials
    sizes = _tiny_sizes()
    assert sum(sizes) == trials["fp32"]["param_count"]
    # torch AdamW on the CPU: fp32 m and v, and a fp32 step count per parameter
    adamw = sum(8 * n + 4 for n in sizes)
    # bitsandbytes AdamW8bit (min_8bit_size 4096, blocks of 256): uint8 m and v with an fp32
    # absmax per block; smaller tensors keep fp32 m and v; two 256-entry fp32 maps, shared
    big = [n for n in sizes if n >= 4096]
    bnb8 = (sum(2 * n + 2 * 4 * math.ceil(n / 256) for n in big)
            + sum(8 * n for n in sizes if n < 4096) + 2 * 256 * 4)
    # bf16 m and v for every tensor, and torchao's fp32 step count per parameter
    bf16_sr = sum(2 * 2 * n + 4 for n in sizes)
    got = {p: t["memory"]["optimizer_bytes"] for p, t in trials.items()}
    assert got == {"fp32": adamw, "fp32+adamw8bit": bnb8, "bf16-amp+adamw-bf16-sr": bf16_sr}
    assert got["fp32+adamw8bit"] < got["bf16-amp+adamw-bf16-sr"] < got["fp32"]
    # the weights stay fp32 in all three: only the state shrank
    assert {t["memory"]["params_bytes"] for t in trials.values()} == {4 * sum(sizes)}
    assert "bitsandbytes AdamW8bit" in trials["fp32+adamw8bit"]["recipe"]
    # the loss each costs against the fp32-state run
    rows = {r["precision"]: r for r in report["comparison"]["rows"]}
    base = trials["fp32"]["steps"][-1]["loss"]
    for label in ("fp32+adamw8bit", "bf16-amp+adamw-bf16-sr"):
        diff = trials[label]["steps"][-1]["loss"] - base
        assert rows[label]["final_loss_diff_vs_fp32"] == pytest.approx(diff, abs=1e-9)
    assert "Loss diff" in run.stdout  # the default table's final-loss column


FIELDS = {"OptimState8bit": ("codes", "scale", "qmap"),
          "OptimState4bit": ("codes", "scale", "qmap"),
          "OptimStateFp8": ("codes", "scale")}


def _distinct_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors``, torchao's state subclasses opened
    by their fields (the wrapper's own storage is a stand-in in the appearance dtype)."""
    seen = {}
    for value in tensors:
        inner = [getattr(value, f) for f in FIELDS.get(type(value).__name__, ())] or [value]
        for t in inner:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _state_tensors(optimizer) -> list:
    return [v for state in optimizer.state.values() for v in state.values()
            if isinstance(v, torch.Tensor)]


# torchao 0.18: (bytes per state element, elements per fp32 scale, fp32 map entries)
LAYOUT = {"adamw8bit-ao": (1, 256, 256), "adamw4bit": (0.5, 128, 16), "adamw-fp8": (1, 256, 0)}
CLASSES = {"adamw8bit-ao": "OptimState8bit", "adamw4bit": "OptimState4bit",
           "adamw-fp8": "OptimStateFp8"}


@pytest.mark.parametrize("family", ["tiny", "llama-gqa"])
@pytest.mark.parametrize("optim", ["adamw8bit-ao", "adamw4bit", "adamw-fp8"])
def test_torchao_state_is_filed_as_optimizer_state_by_its_storage(tmp_path, monkeypatch,
                                                                  family, optim):
    made, live, batches, loaded = [], [], [], []

    def keep(*args, **kw):
        made.append(real(*args, **kw))
        return made[-1]

    def keep_batches(*args, **kw):
        batches.extend(real_batches(*args, **kw))
        return batches

    def keep_model(*args, **kw):
        loaded.append(real_load(*args, **kw))
        return loaded[-1]

    def profiled(step, device, live_bytes, *args):
        live.append(live_bytes)
        return real_profile(step, device, live_bytes, *args)

    real, real_batches, real_profile, real_load = (
        trial_setup.make_optimizer, trial_setup.training_batches, trial_untimed.profile_step,
        trial_setup.load_model)
    monkeypatch.setattr(trial_setup, "load_model", keep_model)
    monkeypatch.setattr(trial_setup, "make_optimizer", keep)
    monkeypatch.setattr(trial_setup, "training_batches", keep_batches)
    monkeypatch.setattr(trial_untimed, "profile_step", profiled)
    model = "tiny"
    if family != "tiny":
        FAMILIES[family]().save_pretrained(tmp_path)
        model = str(tmp_path)
    config = RunConfig(model=model, precisions=(f"fp32+{optim}",), batch_size=2, seq_len=32,
                       steps=1, warmup=1, device="cpu", isolation="inline")
    result = run_trial(config, f"fp32+{optim}", CPU, lambda e: None, lambda: False)
    assert result.status == "ok", result.reason
    (optimizer,) = made
    assert type(optimizer).__name__ == {"adamw8bit-ao": "AdamW8bit", "adamw4bit": "AdamW4bit",
                                        "adamw-fp8": "AdamWFp8"}[optim]
    held = _distinct_bytes(_state_tensors(optimizer))
    assert result.memory.optimizer_bytes == held
    # the same bytes from the shapes: quantised where torchao quantises (4096+ elements in
    # whole blocks), fp32 m and v elsewhere, and a fp32 step count per parameter
    per, block, entries = LAYOUT[optim]
    sizes, quantised = [], 0
    for state in optimizer.state.values():
        n = state["exp_avg"].numel()
        sizes.append(n)
        if n >= 4096 and n % block == 0:
            assert type(state["exp_avg"]).__name__ == CLASSES[optim]
            quantised += 1
    assert quantised >= 2  # the state did shrink somewhere
    expected = sum(2 * (int(n * per) + 4 * n // block + 4 * entries)
                   if n >= 4096 and n % block == 0 else 8 * n for n in sizes) + 4 * len(sizes)
    assert held == expected
    assert result.predicted_memory.optimizer_bytes == expected
    assert held < 8 * sum(sizes)  # less than torch AdamW's fp32 m and v
    assert result.memory.params_bytes == 4 * result.param_count
    # the profiled step counts what was alive before it by the same real storages
    net = loaded[0].model
    assert live == [_distinct_bytes([*net.parameters(), *net.buffers(),
                                     *_state_tensors(optimizer),
                                     *(t for b in batches for t in b.values())])]
    assert result.profiled_step is not None, result.profiled_step_reason


def test_an_optimizer_trial_keeps_its_recipe_hue_darkened():
    from engine.record.colors import PRECISION_COLORS, color_of

    def rgb(color):
        return [int(color[i:i + 2], 16) for i in (1, 3, 5)]

    base = rgb(PRECISION_COLORS["bf16-amp"])  # #009E73
    shades = {o: color_of(f"bf16-amp+{o}") for o in CHOICES}
    assert len(set(shades.values()) | {color_of("bf16-amp")}) == len(CHOICES) + 1
    for color in shades.values():
        mine = rgb(color)
        share = mine[1] / base[1]  # the same hue: every channel scaled by one share of black
        assert 0 < share < 1
        assert all(abs(m - b * share) <= 1 for m, b in zip(mine, base)), (color, base)


@pytest.mark.parametrize("label", ["nf4+adamw4bit", "int8+adamw8bit"])
def test_lora_adapters_take_low_bit_state_too(monkeypatch, label):
    """Nothing refuses a k-bit base with low-bit state: the adapters are fp32 weights."""
    made = []

    def keep(*args, **kw):
        made.append(real(*args, **kw))
        return made[-1]

    real = trial_setup.make_optimizer
    monkeypatch.setattr(trial_setup, "make_optimizer", keep)
    config = RunConfig(model="tiny", precisions=(label,), batch_size=2, seq_len=32, steps=1,
                       warmup=1, device="cpu", isolation="inline", profile_step=False)
    result = run_trial(config, label, CPU, lambda e: None, lambda: False)
    assert result.status == "ok", result.reason
    (optimizer,) = made
    sizes = [p.numel() for g in optimizer.param_groups for p in g["params"]]
    assert sum(sizes) == result.trainable_params < result.param_count
    held = _distinct_bytes(_state_tensors(optimizer))
    assert result.memory.optimizer_bytes == held == result.predicted_memory.optimizer_bytes
    assert held < 8 * sum(sizes)  # below fp32 AdamW's m and v of the same adapters


def test_a_compiled_optimizer_step_needs_a_warm_up_and_a_compiler(monkeypatch):
    with pytest.raises(ValueError, match="--warmup 1"):
        RunConfig(precisions="fp32,fp32+adamw-fp8", warmup=0)
    RunConfig(precisions="fp32,fp32+adamw8bit", warmup=0)  # bitsandbytes compiles nothing

    import torch._inductor.cpp_builder as builder

    def no_compiler():
        raise RuntimeError("no C++ compiler: tried g++, clang++")

    monkeypatch.setattr(builder, "get_cpp_compiler", no_compiler)
    config = RunConfig(model="tiny", precisions=("fp32+adamw4bit",), batch_size=2, seq_len=32,
                       steps=1, warmup=1, device="cpu", isolation="inline")
    result = run_trial(config, "fp32+adamw4bit", CPU, lambda e: None, lambda: False)
    assert result.status == "unsupported"
    assert "C++ compiler" in result.reason and "g++" in result.reason
    assert result.summary is None
