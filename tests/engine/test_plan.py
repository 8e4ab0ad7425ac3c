"""engine.run.plan: a training step traced on fake tensors, checked against real CPU trials,
torch's MemTracker in fake mode and parameter counts worked out by hand."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers as tf

from engine.core.config import RunConfig
from engine.measure.device import probe
from engine.run.plan import PlanConfig, plan
from engine.run.plan_trace import trace_step
from engine.run.trial import run_trial
from tests.cli_in_process import run_cli
from tests.engine.families import FAMILIES

ROOT = Path(__file__).resolve().parents[2]
CPU = probe("cpu")
CATEGORIES = ("params_bytes", "buffers_bytes", "grads_bytes", "optimizer_bytes",
              "inputs_bytes", "weight_copies_bytes", "activations_bytes", "temporaries_bytes")


def _folder(tmp_path, family: str) -> str:
    FAMILIES[family]().save_pretrained(tmp_path / family)
    return str(tmp_path / family)


def _measured(model: str, precision: str, batch: int, seq: int, checkpointing: bool = False,
              grad_accum: int = 1):
    config = RunConfig(model=model, precisions=(precision,), batch_size=batch, seq_len=seq,
                       steps=1, warmup=1, device="cpu", isolation="inline",
                       profile_step=False, grad_checkpointing=checkpointing,
                       grad_accum=grad_accum)
    result = run_trial(config, precision, CPU, lambda e: None, lambda: False)
    assert result.status == "ok", result.reason
    return result.memory


def _close(traced: int, measured: int) -> bool:
    return abs(traced - measured) <= 0.02 * measured if measured else traced == 0


# autocast recipes of GPT-2 traced as the CPU runs them (trace_as="cpu": CUDA's autocast
# keeps gelu_new's pow in fp32, the CPU's does not); Llama's step has no op the two
# policies cast differently, so traced as the card runs it, it equals the CPU trial too
@pytest.mark.parametrize("model,precision,checkpointing,trace_as", [
    ("tiny", "fp32", False, "card"),
    ("tiny", "bf16-amp", False, "cpu"),
    ("tiny", "fp16-amp", True, "cpu"),
    ("llama-gqa", "bf16-amp", False, "card"),
    ("gpt2", "fp32", True, "card"),
])
def test_traced_step_equals_a_real_cpu_trial(tmp_path, model, precision, checkpointing,
                                             trace_as):
    source = model if model == "tiny" else _folder(tmp_path, model)
    config = PlanConfig(model=source, precisions=(precision,), batch_size=2, seq_len=32,
                        grad_checkpointing=checkpointing, max_batch=0, trace_as=trace_as)
    result = plan(config)
    trial = result.trials[0]
    assert trial.method == "traced", trial.reason
    measured = _measured(source, precision, 2, 32, checkpointing)
    traced = trial.memory
    assert _close(traced.total_bytes, measured.total_bytes), (traced.total_bytes,
                                                              measured.total_bytes)
    for name in CATEGORIES:
        assert _close(getattr(traced, name), getattr(measured, name)), name
    assert traced.peak_phase == measured.peak_phase


def test_cli_grad_accum_traces_gradients_kept_across_micro_batches():
    """3 micro-batches: the second and third forwards run while the first's gradients are
    held, as in a real trial with --grad-accum 3."""
    run = _cli("--model", "tiny", "--precision", "fp32,bf16-amp", "--batch-size", "2",
               "--seq-len", "32", "--grad-accum", "3", "--card", "RTX 4090", "--max-batch",
               "0", "--trace-as", "cpu", "--json", "--quiet")
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert data["grad_accum"] == 3
    for trial in data["trials"]:
        measured = _measured("tiny", trial["precision"], 2, 32, grad_accum=3)
        traced = trial["memory"]
        assert _close(traced["total_bytes"], measured.total_bytes), (
            traced["total_bytes"], measured.total_bytes)
        for name in CATEGORIES:
            assert _close(traced[name], getattr(measured, name)), name
        assert traced["peak_phase"] == measured.peak_phase
        # and not the single-micro-batch figure: gradients of the first micro-batch are live
        single = _measured("tiny", trial["precision"], 2, 32).total_bytes
        assert traced["total_bytes"] > single


def test_grad_accum_on_a_second_family(tmp_path):
    source = _folder(tmp_path, "llama-gqa")
    config = PlanConfig(model=source, precisions=("bf16-amp",), batch_size=2, seq_len=32,
                        grad_accum=2, max_batch=0)
    traced = plan(config).trials[0].memory
    measured = _measured(source, "bf16-amp", 2, 32, grad_accum=2)
    assert _close(traced.total_bytes, measured.total_bytes), (traced.total_bytes,
                                                              measured.total_bytes)
    for name in CATEGORIES:
        assert _close(getattr(traced, name), getattr(measured, name)), name


def _llama_params(h, f, layers, heads, kv_heads, vocab, head_dim=None, tied=False):
    """Llama's parameter count from its config: embeddings, per layer q/k/v/o, SwiGLU's
    three projections and two RMSNorms, the final norm and the LM head."""
    head_dim = head_dim or h // heads
    attention = h * heads * head_dim * 2 + h * kv_heads * head_dim * 2
    per_layer = attention + 3 * h * f + 2 * h
    return vocab * h * (1 if tied else 2) + layers * per_layer + h


def test_8b_widths_match_memtracker_and_hand_counted_bytes(tmp_path):
    """Llama 3 8B's widths (config.json of meta-llama/Meta-Llama-3-8B) with 2 layers: every
    layer is the same, so 2 show what 32 do, at a fraction of the tracing time."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    h, f, layers, heads, kv, vocab = 4096, 14336, 2, 32, 8, 128256
    cfg = tf.LlamaConfig(hidden_size=h, intermediate_size=f, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab,
                         max_position_embeddings=8192, tie_word_embeddings=False)
    cfg.save_pretrained(tmp_path / "l8b2")
    config = PlanConfig(model=str(tmp_path / "l8b2"), precisions=("bf16-amp",), batch_size=1,
                        seq_len=64, max_batch=0)
    measured = trace_step(config, "bf16-amp", 1).memory

    n = _llama_params(h, f, layers, heads, kv, vocab)
    tensors = 3 + 9 * layers  # embeddings, final norm, head; 9 per layer
    at = measured.at_peak
    assert at["params"] == 4 * n
    assert at["optimizer"] == 8 * n + 4 * tensors  # m and v in fp32, a float step each
    assert measured.at_phase_start["optimizer"]["grads"] == 4 * n

    # torch's own tracker over the same step, built here without engine code
    cfg.use_cache = False
    with FakeTensorMode() as mode:
        model = tf.LlamaForCausalLM(cfg)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ids = mode.from_tensor(torch.randint(0, vocab, (1, 64)))
        tracker = MemTracker()
        tracker.track_external(model, opt)
        with tracker:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            del loss
            opt.step()
            opt.zero_grad(set_to_none=True)
        peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    assert abs(measured.peak_bytes - peak) <= 0.02 * peak, (measured.peak_bytes, peak)


def _cli(*args):
    """``main.py plan`` in this process: these tests' subject is the command's figures."""
    return run_cli("plan", *args)


def test_cli_llama3_8b_on_an_rtx_4090(tmp_path):
    # --no-levers: the answer's changes (each quantised recipe, traced at 8B's widths) are
    # test_plan_answer.py's; this test reads the traced step and the card's verdict. The
    # real process, end to end: the file's one spawned ``main.py plan``
    run = subprocess.run([sys.executable, "main.py", "plan", "--model", "llama-3-8b",
                          "--precision", "bf16-amp", "--batch-size", "1", "--seq-len", "2048",
                          "--card", "RTX 4090", "--max-batch", "0", "--json", "--quiet",
                          "--no-levers", "--out", str(tmp_path / "plan.html")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    trial = data["trials"][0]
    assert trial["precision"] == "bf16-amp" and trial["method"] == "traced"
    mem = trial["memory"]
    # Llama 3 8B, config.json of meta-llama/Meta-Llama-3-8B
    n = _llama_params(4096, 14336, 32, 32, 8, 128256)
    assert n == 8_030_261_248
    assert mem["params_bytes"] == 4 * n  # AMP keeps fp32 weights
    assert mem["at_phase_start_bytes"]["optimizer"]["grads"] == 4 * n
    # fp32 weights, gradients and AdamW's two moments alone: 16 bytes a parameter
    static = 16 * n
    assert mem["total_bytes"] >= static
    card = trial["cards"][0]
    assert card["card"] == "NVIDIA GeForce RTX 4090"
    usable = 24563 * 2**20 - 2**30  # the 4090's 24563 MiB (CUDA's total) less 1 GiB
    assert card["usable_bytes"] == usable
    assert static > usable and card["fits"] is False
    assert card["headroom_bytes"] == usable - mem["total_bytes"]
    assert "prediction" in card["prediction_model"] and card["predicted_step_ms"] > 0
    page = (tmp_path / "plan.html").read_text(encoding="utf-8")
    assert "does not fit" in page and "NVIDIA GeForce RTX 4090" in page


@pytest.mark.parametrize("args,needle", [
    (("--card", "RTX 9999"), "unknown card 'RTX 9999'"),
    (("--batch-size", "0"), "batch size"),
    (("--model", "no-such-model"), "no-such-model"),
    (("--precision", "fp7"), "fp7"),
    (("--model", "tiny", "--seq-len", "513"), "--seq-len 512"),  # tiny has 512 positions
    (("--grad-accum", "0"), "--grad-accum"),
    (("--nproc-per-node", "4"), "--strategy ddp or fsdp2"),
    (("--strategy", "fsdp2", "--precision", "nf4"), "nf4 has no fsdp2 recipe"),
    (("--precision", "fp8-fsdp-ag"), "plan it with --strategy fsdp2"),
])
def test_cli_bad_input_exits_2_with_one_line(args, needle):
    run = _cli(*args)
    assert run.returncode == 2, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.startswith("ampscope:")]
    assert len(lines) == 1 and needle in lines[0], run.stderr
    assert run.stdout == ""


def test_largest_micro_batch_agrees_with_real_trials():
    """A card whose usable memory lies between the real peaks at batch 3 and 4: the search
    over traced steps must land on 3."""
    from engine.run.plan import card_memory

    p3 = _measured("tiny", "fp32", 3, 32).total_bytes
    p4 = _measured("tiny", "fp32", 4, 32).total_bytes
    assert p4 > p3
    _, memory, _ = card_memory("RTX 4090")
    usable = (p3 + p4) // 2
    config = PlanConfig(model="tiny", precisions=("fp32",), batch_size=1, seq_len=32,
                        cards=("RTX 4090",), context_bytes=memory - usable, max_batch=16)
    card = plan(config).trials[0].cards[0]
    assert card.fits is True and card.max_batch == 3


def test_a_card_sold_in_several_sizes_without_its_size_is_na():
    config = PlanConfig(model="tiny", precisions=("fp32",), batch_size=1, seq_len=16,
                        cards=("A100-SXM4",), max_batch=0)
    result = plan(config)
    card = result.trials[0].cards[0]
    assert card.fits is None and card.headroom_bytes is None
    assert "add the size to the card name" in card.reason
    assert "n/a (NVIDIA A100 SXM4 comes in 40GB or 80GB" in result.answers[0].text


def test_a_card_with_its_datasheet_capacity_says_so():
    """The RTX 3090 (a printout of CUDA's total) and the A10 (only its datasheet's 24 GB):
    both judged, the A10's line saying its figure is the nominal one."""
    config = PlanConfig(model="tiny", precisions=("fp32",), batch_size=1, seq_len=16,
                        cards=("RTX 3090", "A10"), max_batch=0)
    result = plan(config)
    rtx, a10 = result.trials[0].cards
    assert rtx.memory_bytes == 24259 * 2**20 and rtx.fits is True
    assert a10.memory_bytes == 24 * 2**30 and a10.memory_kind == "datasheet" and a10.fits
    assert "datasheet's nominal capacity" in result.answers[1].text
    assert "datasheet" not in result.answers[0].text


def _trainable_sizes(config) -> list[int]:
    """Element counts of every parameter, from a model built on the meta device here."""
    cls = tf.AutoModelForCausalLM
    with torch.device("meta"):
        return [p.numel() for p in cls.from_config(config).parameters()]


def _bnb_adamw8bit_state(sizes) -> int:
    """bitsandbytes' blockwise 8-bit AdamW: for a tensor of 4096+ elements two uint8 codes
    per element and one fp32 absmax per 256-element block for each of m and v, fp32 m and
    v below that, and the two 256-entry fp32 maps (signed and unsigned) shared by all."""
    return sum(2 * (n + 4 * -(-n // 256)) if n >= 4096 else 2 * 4 * n for n in sizes) \
        + 2 * 256 * 4


def _torchao_state(sizes, bits: int, block: int, qmap_entries: int, plain_bytes: int) -> int:
    """torchao.optim's low-bit AdamW: for a tensor of 4096+ elements in whole blocks, m and
    v each hold codes (bits per element), an fp32 scale per block and their own fp32 lookup
    map; other tensors keep m and v in the weight's dtype; an fp32 step count per tensor."""
    total = 0
    for n in sizes:
        if n >= 4096 and n % block == 0:
            total += 2 * (n * bits // 8 + 4 * (n // block) + 4 * qmap_entries)
        else:
            total += 2 * plain_bytes * n
        total += 4  # state["step"] = torch.tensor(0.0)
    return total


GPT2_TINY = tf.GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=1024, n_positions=512)


@pytest.mark.parametrize("family", ["tiny", "llama-gqa"])
def test_cli_recipe_plus_optimizer_state_equals_hand_counted_bytes(tmp_path, family):
    """RECIPE+OPTIM labels on the command line: each trial traces its own optimiser, and
    the optimizer category is the state's exact bytes, counted here from the layouts."""
    if family == "tiny":
        source, sizes = "tiny", _trainable_sizes(GPT2_TINY)
    else:
        source = _folder(tmp_path, family)
        sizes = _trainable_sizes(FAMILIES[family]())
    run = _cli("--model", source, "--precision",
               "bf16-amp+adamw8bit,fp32+adamw4bit,fp32+adamw8bit-ao,bf16+adamw-bf16-sr",
               "--batch-size", "1", "--seq-len", "16", "--card", "RTX 4090", "--max-batch",
               "0", "--json", "--quiet")
    assert run.returncode == 0, run.stderr
    trials = {t["precision"]: t for t in json.loads(run.stdout)["trials"]}
    expected = {
        "bf16-amp+adamw8bit": _bnb_adamw8bit_state(sizes),
        # 4-bit: 16-entry maps, 128-element blocks; 8-bit: 256 entries, 256 elements
        "fp32+adamw4bit": _torchao_state(sizes, 4, 128, 16, 4),
        "fp32+adamw8bit-ao": _torchao_state(sizes, 8, 256, 256, 4),
        # bf16 m and v for every tensor, and the step count
        "bf16+adamw-bf16-sr": sum(2 * 2 * n + 4 for n in sizes),
    }
    for label, state in expected.items():
        trial = trials[label]
        assert trial["method"] == "traced", trial["reason"]
        assert trial["optimizer"] == label.split("+")[1]
        assert trial["memory"]["optimizer_bytes"] == state, label
    n = sum(sizes)
    assert trials["bf16-amp+adamw8bit"]["memory"]["params_bytes"] == 4 * n  # fp32 master
    assert trials["bf16+adamw-bf16-sr"]["memory"]["params_bytes"] == 2 * n


def test_8bit_adamw_traced_equals_a_real_cpu_trial():
    """bitsandbytes' 8-bit AdamW on fake tensors (its fake kernels, maps built outside the
    fake mode) against the same optimiser in a real CPU trial."""
    config = PlanConfig(model="tiny", precisions=("fp32+adamw8bit",), batch_size=2,
                        seq_len=32, max_batch=0)
    trial = plan(config).trials[0]
    assert trial.method == "traced", trial.reason
    measured = _measured("tiny", "fp32+adamw8bit", 2, 32)
    traced = trial.memory
    assert _close(traced.total_bytes, measured.total_bytes), (traced.total_bytes,
                                                              measured.total_bytes)
    for name in CATEGORIES:
        assert _close(getattr(traced, name), getattr(measured, name)), name
    assert traced.optimizer_bytes == _bnb_adamw8bit_state(_trainable_sizes(GPT2_TINY))


def _shapes(config) -> list[tuple[int, ...]]:
    with torch.device("meta"):
        return [tuple(p.shape) for p in tf.AutoModelForCausalLM.from_config(config).parameters()]


@pytest.mark.parametrize("family", ["tiny", "llama-gqa"])
def test_cli_fsdp2_and_ddp_per_rank_bytes_equal_hand_counts(tmp_path, family):
    """FSDP2 at world 4 on torch's fake process group: rank 0 holds its dim-0 shard of every
    parameter (ceil(rows / 4) rows), the same of each fp32 gradient, AdamW's m and v of its
    shard and a step count per tensor. DDP: the whole model on every rank, plus a bucket
    copy of every gradient."""
    if family == "tiny":
        source, config = "tiny", GPT2_TINY
    else:
        source, config = _folder(tmp_path, family), FAMILIES[family]()
    shapes = _shapes(config)
    world = 4
    shard = sum(-(-s[0] // world) * (torch.Size(s[1:]).numel()) for s in shapes)
    n = sum(torch.Size(s).numel() for s in shapes)

    def cli(*extra):
        run = _cli("--model", source, "--precision", "fp32,bf16-amp", "--batch-size", "1",
                   "--seq-len", "16", "--card", "RTX 4090", "--max-batch", "0", "--json",
                   "--quiet", *extra)
        assert run.returncode == 0, run.stderr
        return json.loads(run.stdout)

    fsdp = cli("--strategy", "fsdp2", "--nproc-per-node", str(world))
    assert fsdp["strategy"] == "fsdp2" and fsdp["nproc_per_node"] == world
    for trial in fsdp["trials"]:
        assert trial["method"] == "traced", trial["reason"]
        mem = trial["memory"]
        assert mem["params_bytes"] == 4 * shard, trial["precision"]  # fp32 shards
        assert mem["at_phase_start_bytes"]["optimizer"]["grads"] == 4 * shard
        assert mem["optimizer_bytes"] == 8 * shard + 4 * len(shapes)

    # the one-process step, planned directly in the test's process (as the CLI plans it)
    single = {t.precision: t.memory for t in plan(PlanConfig(
        model=source, precisions=("fp32", "bf16-amp"), batch_size=1, seq_len=16,
        cards=("RTX 4090",), max_batch=0, history=False, levers=False)).trials}
    ddp = cli("--strategy", "ddp", "--nproc-per-node", str(world))
    for trial in ddp["trials"]:
        mem = trial["memory"]
        assert mem["params_bytes"] == 4 * n
        assert mem["total_bytes"] == single[trial["precision"]].total_bytes + 4 * n
        assert "computed, not traced" in mem["total_method"]
        card = trial["cards"][0]
        assert card["headroom_bytes"] == card["usable_bytes"] - mem["total_bytes"]


@pytest.mark.parametrize("family", ["tiny", "llama-gqa"])
def test_cli_float8_under_fsdp2_per_rank_bytes_equal_hand_counts(tmp_path, family):
    """fp8 and fp8-fsdp-ag traced as rank 0 of 4 on the fake process group: fp32 master
    shards, their gradients and AdamW's state, counted here; the float8 all-gather holds
    1-byte unsharded weights where fp8 gathers them in fp32, so its peak is no higher; the
    untraced scale precompute is said."""
    if family == "tiny":
        source, config = "tiny", GPT2_TINY
    else:
        source, config = _folder(tmp_path, family), FAMILIES[family]()
    shapes = _shapes(config)
    world = 4
    shard = sum(-(-s[0] // world) * (torch.Size(s[1:]).numel()) for s in shapes)
    run = _cli("--model", source, "--precision", "fp8,fp8-fsdp-ag", "--batch-size", "1",
               "--seq-len", "16", "--card", "H100 SXM", "--max-batch", "0", "--json",
               "--quiet", "--no-history", "--strategy", "fsdp2", "--nproc-per-node", str(world))
    assert run.returncode == 0, run.stderr
    trials = {t["precision"]: t for t in json.loads(run.stdout)["trials"]}
    for trial in trials.values():
        assert trial["method"] == "traced", trial["reason"]
        mem = trial["memory"]
        assert mem["params_bytes"] == 4 * shard, trial["precision"]
        assert mem["at_phase_start_bytes"]["optimizer"]["grads"] == 4 * shard
        assert mem["optimizer_bytes"] == 8 * shard + 4 * len(shapes)
        assert set(trial["flops_by_peak_dtype"]) >= {"fp8"}  # the float8 GEMMs were traced
    ag = trials["fp8-fsdp-ag"]["memory"]
    assert ag["total_bytes"] <= trials["fp8"]["memory"]["total_bytes"]
    assert "scale precompute" in ag["notes"] and "is not traced" in ag["notes"]
