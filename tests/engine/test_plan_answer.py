"""The plan's answer, first line per card, through the command line's parser and handler
(run in the test's process: the subject is the command's text and figures): fits as asked,
or the smallest change that fits, each change planned (its figures are those of planning
the changed configuration directly), on two model families; names users type resolve."""

import json

import pytest

from tests.cli_in_process import run_cli
from tests.engine.families import FAMILIES

CARD = "NVIDIA GeForce RTX 4090"
CARD_BYTES = 24563 * 2**20  # the 4090's total as CUDA reports it (resources/peak_flops.json)
BATCH, SEQ = 8, 128


def _cli(*args):
    return run_cli("plan", *args)


def _model(tmp_path, family: str) -> str:
    if family == "tiny":
        return "tiny"
    FAMILIES[family]().save_pretrained(tmp_path / family)
    return str(tmp_path / family)


def _peak(model: str, batch: int = BATCH, **changes) -> int:
    """The step's peak planned directly, the reference an answer's figures are checked
    against: engine.run.plan.plan, which the CLI's handler calls (the answers themselves
    come from the command line's parser and handler)."""
    from engine.run.plan import PlanConfig, plan

    config = PlanConfig(model=model, precisions=("fp32",), batch_size=batch, seq_len=SEQ,
                        cards=("RTX 4090",), max_batch=0, history=False, levers=False,
                        **changes)
    return plan(config).trials[0].memory.total_bytes


def _size(value: int) -> str:
    return f"{value / 2**30:.2f} GiB" if abs(value) >= 2**30 else f"{value / 2**20:.0f} MiB"


def _spare(value: int) -> str:  # the answer's room to spare: a tenth of a GiB
    return f"{value / 2**30:.1f} GiB" if abs(value) >= 2**30 else f"{value / 2**20:.0f} MiB"


@pytest.mark.parametrize("family", ["tiny", "llama-gqa"])
def test_cli_answer_first_names_checkpointing_when_only_it_fits(tmp_path, family):
    """A card whose usable memory lies between the step's peak with and without gradient
    checkpointing: the first line says no recipe fits as asked and names the recipe with
    checkpointing, with the room the checkpointed step planned on its own leaves."""
    model = _model(tmp_path, family)
    plain, ckpt = _peak(model), _peak(model, grad_checkpointing=True)
    assert ckpt < plain
    usable = (plain + ckpt) // 2
    run = _cli("--model", model, "--precision", "fp32", "--batch-size", str(BATCH),
               "--seq-len", str(SEQ), "--card", "RTX 4090", "--max-batch", "0",
               "--no-history", "--quiet", "--cuda-context", str(CARD_BYTES - usable))
    assert run.returncode == 0, run.stderr
    first = run.stdout.splitlines()[0]
    assert first == (f"{model} on {CARD}: no recipe fits as asked; fp32 with gradient "
                     f"checkpointing, {_spare(usable - ckpt)} to spare (traced)")


@pytest.mark.parametrize("family", ["tiny", "llama-gqa"])
def test_cli_answer_names_the_largest_micro_batch_and_the_accumulation(tmp_path, family):
    """Batch 8 does not fit but a smaller one does: the answer names the largest that fits
    (its peak within, the next one's over, each planned here) and the accumulation that
    keeps 8 sequences per step."""
    model = _model(tmp_path, family)
    peaks = {b: _peak(model, batch=b) for b in (3, 4)}
    usable = (peaks[3] + peaks[4]) // 2
    run = _cli("--model", model, "--precision", "fp32", "--batch-size", str(BATCH),
               "--seq-len", str(SEQ), "--card", "RTX 4090", "--max-batch", "16",
               "--no-history", "--quiet", "--json", "--cuda-context", str(CARD_BYTES - usable))
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout)["answers"][0]
    assert answer["max_batch"] == 3 and answer["precision"] == "fp32"
    assert answer["text"] == (f"{model} on {CARD}: no recipe fits at micro-batch 8; fp32 "
                              "fits at micro-batch 3 (micro-batch 2 with --grad-accum 4 keeps "
                              "the 8 sequences per optimizer step) (traced)")


def test_cli_answer_when_nothing_fits_lists_every_lever_tried():
    """1 MiB usable: nothing fits; every rung is tried or skipped with its bound, and the
    answer says so with the smallest peak asked."""
    run = _cli("--model", "tiny", "--precision", "fp32", "--batch-size", "1", "--seq-len",
               "32", "--card", "RTX 4090", "--max-batch", "0", "--no-history", "--quiet",
               "--json", "--cuda-context", str(CARD_BYTES - 2**20))
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    answer, peak = data["answers"][0], data["trials"][0]["memory"]["total_bytes"]
    assert answer["text"] == (f"tiny on {CARD}: no recipe fits, as asked or with any lever "
                              f"AmpScope knows; the smallest peak asked is fp32's "
                              f"{_size(peak)} of 1 MiB usable")
    tried = "\n".join(answer["tried"])
    for lever in ("with gradient checkpointing: skipped", "8-bit AdamW", "4-bit AdamW",
                  "int8 as LoRA on 8-bit weights (int8)",
                  "nf4 as QLoRA with 4-bit weights (nf4)", "FSDP2 over 2 cards",
                  "FSDP2 over 8 cards"):
        assert lever in tried, tried


def test_cli_answer_fits_as_asked_comes_first_and_html_leads_with_it(tmp_path):
    out = tmp_path / "plan.html"
    run = _cli("--model", "tiny", "--precision", "fp32,bf16", "--batch-size", "2",
               "--seq-len", "32", "--card", "RTX 4090", "--max-batch", "0", "--no-history",
               "--quiet", "--out", str(out))
    assert run.returncode == 0, run.stderr
    first = run.stdout.splitlines()[0]
    assert first.startswith(f"tiny on {CARD}: fp32, bf16 fit as asked; ")
    page = out.read_text(encoding="utf-8")
    assert page.index("fit as asked") < page.index("<table")


@pytest.mark.parametrize("typed,limit,preset", [
    ("llama-7b", 2048, "llama-7b"), ("Llama2-7B", 4096, "llama-2-7b"),
    ("llama-2-7b", 4096, "llama-2-7b"), ("GPT2-XL", 1024, "gpt2-xl"),
])
def test_names_users_type_resolve_to_a_preset(typed, limit, preset):
    """Each name resolves to its preset: its position limit (from the model's config.json,
    named in resources/presets.json) is what refuses a longer sequence."""
    run = _cli("--model", typed, "--seq-len", str(limit + 1))
    assert run.returncode == 2
    assert f"({limit} positions): set --seq-len {limit} or less" in run.stderr, run.stderr


def test_a_misspelt_name_gets_did_you_mean():
    run = _cli("--model", "lama-7b")
    assert run.returncode == 2 and run.stdout == ""
    assert "did you mean llama-7b" in run.stderr, run.stderr


def test_step_times_read_in_units():
    from engine.run.plan_text import duration_text

    assert [duration_text(v) for v in (0.123, 7.5, 107.4, 1834.0, 125_000.0, None)] == [
        "0.12 ms", "7.5 ms", "107 ms", "1.83 s", "2 min 5 s", "n/a"]


@pytest.fixture(scope="module")
def quantised_plan(tmp_path_factory):
    """(model, trials by precision): one CLI plan of nf4 and int8 per family, shared by
    the tests of each recipe."""
    plans = {}

    def planned(family: str):
        if family not in plans:
            model = _model(tmp_path_factory.mktemp("quantised"), family)
            run = _cli("--model", model, "--precision", "nf4,int8", "--batch-size", "2",
                       "--seq-len", "32", "--card", "RTX 4090", "--max-batch", "0",
                       "--no-history", "--no-levers", "--json", "--quiet")
            assert run.returncode == 0, run.stderr
            plans[family] = model, {t["precision"]: t
                                    for t in json.loads(run.stdout)["trials"]}
        return plans[family]

    return planned


@pytest.mark.parametrize("family", ["tiny", "llama-gqa"])
@pytest.mark.parametrize("precision", ["nf4", "int8"])
def test_cli_quantised_categories_add_up_and_the_memory_models_terms_too(quantised_plan,
                                                                        family, precision):
    """A quantised recipe is traced (engine.run.plan_quant): its categories add up to its
    peak. The memory model, which predicts a trial's memory and stands in where a trace
    cannot run, predicts it too: each phase of its formula's text is the sum of the terms
    it lists, the largest being the peak."""
    import re

    from engine.core.recipes import recipe
    from engine.models.memory_model import predict_memory
    from engine.run.plan import PlanConfig, meta_shape

    model, trials = quantised_plan(family)
    trial = trials[precision]
    assert trial["method"] == "traced", trial["reason"]
    memory = trial["memory"]
    cats = ("params_bytes", "buffers_bytes", "quant_state_bytes", "grads_bytes",
            "optimizer_bytes", "inputs_bytes", "weight_copies_bytes", "activations_bytes",
            "temporaries_bytes")
    assert sum(memory[c] for c in cats) == memory["total_bytes"]
    assert memory["quant_state_bytes"] > 0
    shape = meta_shape(PlanConfig(model=model, precisions=(precision,), cards=("RTX 4090",)),
                       precision)
    predicted = predict_memory(recipe(precision), "adamw", shape, 2, 32, False, "cuda")
    phases = {}
    for line in predicted.formula.splitlines():
        found = re.fullmatch(r"([a-z ]+) = (.+) = ([\d,]+) B", line)
        if found:
            terms = [int(b.replace(",", "")) for b in re.findall(r" ([\d,]+) B", found[2])]
            phases[found[1]] = int(found[3].replace(",", ""))
            assert sum(terms) == phases[found[1]], line
    assert {"backward start", "optimiser step"} <= set(phases)
    assert max(phases.values()) == predicted.total_bytes
    assert predicted.peak_phase == max(phases, key=phases.get)


@pytest.mark.parametrize("family", ["tiny", "llama-gqa"])
def test_cli_bf16_autocast_is_preferred_where_it_ties_fp32_on_memory(tmp_path, family):
    """Two tokens: activations are a rounding error beside what AMP holds as fp32 does (fp32
    weights, gradients, AdamW's moments), so the two tie on memory; a card with bf16
    tensor cores is told to train in bf16 autocast, and why."""
    model = _model(tmp_path, family)
    run = _cli("--model", model, "--precision", "fp32,bf16-amp", "--batch-size", "1",
               "--seq-len", "2", "--card", "H100 SXM", "--max-batch", "0", "--no-history",
               "--quiet", "--json")
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    fp32, amp = (t["memory"] for t in data["trials"])
    assert fp32["peak_phase"] == amp["peak_phase"]
    assert abs(fp32["total_bytes"] - amp["total_bytes"]) <= 2**20
    answer = data["answers"][0]
    assert answer["precision"] == "bf16-amp"
    assert answer["text"].endswith("; bf16-amp ties fp32 on memory and is preferred: the card "
                                   "runs bf16 on its tensor cores, and bf16 autocast is the "
                                   "recipe people train in"), answer["text"]


def test_cli_answer_plans_each_card_its_own_change(tmp_path):
    """Two cards, neither fitting as asked: a change planned for the first (8-bit AdamW,
    short on the T4) is judged again on the second, where it fits; once, the first card's
    verdict was reused for the second and the 4090 was sent on to int8."""
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 8192, "intermediate_size": 16384,
        "num_hidden_layers": 2, "num_attention_heads": 64, "num_key_value_heads": 8,
        "vocab_size": 32000, "max_position_embeddings": 512, "bos_token_id": 1,
        "eos_token_id": 2}))
    model = str(tmp_path)
    shape = ("--batch-size", "1", "--seq-len", "64", "--max-batch", "0", "--no-history")
    run = _cli("--model", model, "--precision", "fp32", "--card", "T4,RTX 4090", *shape,
               "--json")
    assert run.returncode == 0, run.stderr
    t4, rtx = json.loads(run.stdout)["answers"]
    assert t4["precision"] == "nf4", t4["text"]  # 8-bit AdamW is short on the T4
    # judged per card, traced once: the progress lines name each change planned (per card)
    # and each step traced; the 4090's changes, all planned for the T4 first, trace nothing
    lines = run.stderr.splitlines()
    planned = [x for x in lines if x.startswith("plan: answer: planning ")]
    again = next(i for i, x in enumerate(lines) if x in planned and x in lines[:i])
    assert lines[again] == "plan: answer: planning fp32 with 8-bit AdamW (--optimizer adamw8bit)"
    assert not [x for x in lines[again:] if ": tracing " in x], run.stderr
    from engine.run.plan import PlanConfig, plan

    eight_bit = PlanConfig(model=model, precisions=("fp32",), batch_size=1, seq_len=64,
                           optimizer="adamw8bit", cards=("RTX 4090",), max_batch=0,
                           history=False, levers=False)
    peak = plan(eight_bit).trials[0].memory.total_bytes  # planned directly, as _peak
    spare = CARD_BYTES - 2**30 - peak  # the 4090 as CUDA reports it, less the allowance
    assert rtx["text"] == (f"{model} on {CARD}: no recipe fits as asked; fp32 with 8-bit "
                           f"AdamW (--optimizer adamw8bit), {_spare(spare)} to spare (traced)")
