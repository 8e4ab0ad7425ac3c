"""Per-layer precision (``fp8:keep-ends``, ``fp8:keep-attn``): a real inline CPU trial keeps
exactly the Linear layers the option names in bf16, its module tree says so, and its
counted FLOPs split between bf16 and fp8 as those layers' shapes say."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import transformers as tf
from torch import nn
from transformers.pytorch_utils import Conv1D

from engine.core.config import RunConfig, parse_precisions
from engine.measure.device import probe
from engine.record.json_report import read_json
from engine.report.html import render_html
from engine.run.trial import run_trial

CPU = probe("cpu")
ROOT = Path(__file__).resolve().parents[2]
B, S = 2, 16  # float8 GEMMs need tokens per micro-batch divisible by 16
LAYERS = 3  # a middle block, so keep-ends leaves something in fp8

# every width a multiple of 16 so each block Linear converts; 4 heads of 16
FAMILIES = {
    "gpt2": (tf.GPT2Config(n_embd=64, n_layer=LAYERS, n_head=4, n_inner=128, vocab_size=256,
                           n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
             tf.GPT2LMHeadModel, r"transformer\.h\.(\d+)\.", {"attn"}),
    "llama": (tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                             num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                             max_position_embeddings=64),
              tf.LlamaForCausalLM, r"model\.layers\.(\d+)\.", {"self_attn"}),
}


def _matmul_layers(model_class, config) -> dict[str, int]:
    """name -> in x out of every Linear / Conv1D of a freshly built model of the family."""
    found = {}
    for name, mod in model_class(config).named_modules():
        if isinstance(mod, nn.Linear):
            found[name] = mod.in_features * mod.out_features
        elif isinstance(mod, Conv1D):
            found[name] = mod.nx * mod.nf
    return found


def _expected_bf16(names, keep: str, block_re: str, attn_parts: set[str]) -> set[str]:
    """The option's layers, read from the names alone (plus the LM head, always bf16)."""
    kept = {"lm_head"}
    for name in names:
        block = re.match(block_re, name)
        if keep == "keep-ends" and block and int(block.group(1)) in (0, LAYERS - 1):
            kept.add(name)
        if keep == "keep-attn" and attn_parts & set(name.split(".")):
            kept.add(name)
    return kept


@pytest.mark.parametrize("keep", ["keep-ends", "keep-attn"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_kept_layers_run_bf16_and_their_flops_are_filed_there(tmp_path, family, keep):
    config, model_class, block_re, attn_parts = FAMILIES[family]
    config.save_pretrained(tmp_path)
    label = f"fp8:{keep}"
    run = RunConfig(model=str(tmp_path), precisions=(label,), batch_size=B, seq_len=S,
                    steps=1, warmup=0, device="cpu", isolation="inline", profile_step=False)
    result = run_trial(run, label, CPU, lambda e: None, lambda: False)
    assert result.status == "ok", result.reason
    assert result.support == "emulated"  # fp8's verdict on the CPU, the suffix kept

    layers = _matmul_layers(model_class, config)
    bf16 = _expected_bf16(layers, keep, block_re, attn_parts)
    fp8 = set(layers) - bf16
    assert bf16 - {"lm_head"} and fp8  # the option splits the model both ways

    tree = {m.name: m for m in result.module_tree}
    assert {n for n in layers if tree[n].type == "Float8Linear"} == fp8
    assert {n: tree[n].matmul_dtype for n in layers} == (
        {n: "bf16" for n in bf16} | {n: "fp8" for n in fp8})
    # a block holds the dtypes its layers ran in: kept ends only bf16, the middle only fp8
    blocks = {n.rsplit(".", 2)[0] for n in layers if re.match(block_re, n)}
    for block in blocks:
        under = {d for n, d in ((n, tree[n].matmul_dtype) for n in layers)
                 if n.startswith(block + ".")}
        assert tree[block].matmul_dtype == ", ".join(sorted(under))
    assert tree[""].matmul_dtype == "bf16, fp8"

    # forward, input gradient and weight gradient: 2 x tokens x in x out each (tensorwise
    # float8 runs all three GEMMs in fp8). Attention (bf16) per layer and token: QK^T and AV
    # forward, 2 x s x width each; the fused kernel's backward recomputes QK^T and runs
    # four more, 5 x 2 x s x width: 14 x L x s x width x tokens
    tokens = B * S
    by_dtype = result.flops.by_peak_dtype
    assert by_dtype["fp8"] == sum(3 * 2 * tokens * layers[n] for n in fp8)
    attention = 14 * LAYERS * S * 64 * tokens
    assert by_dtype["bf16"] == sum(3 * 2 * tokens * layers[n] for n in bf16) + attention


def test_the_option_is_refused_up_front_where_no_recipe_takes_it():
    assert parse_precisions("fp8:keep-ends+adamw8bit,fp8-rowwise:keep-attn") == (
        "fp8:keep-ends+adamw8bit", "fp8-rowwise:keep-attn")
    for bad in ("bf16-amp:keep-ends", "fp8:keep-mlp", "fp8:"):
        with pytest.raises(ValueError, match="fp8:keep-ends"):
            parse_precisions(bad)


def _cli(args, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AMPSCOPE_DATA_DIR": str(tmp_path / "data")}
    return subprocess.run([sys.executable, "main.py", *args], cwd=ROOT, text=True,
                          capture_output=True, env=env, timeout=600)


def test_the_cli_refuses_a_bad_option_before_the_run(tmp_path):
    run = _cli(["profile", "--precision", "fp32,bf16-amp:keep-attn"], tmp_path)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        "ampscope: error: 'bf16-amp:keep-attn': a ':keep-...' suffix takes one of "
        ":keep-ends, :keep-attn after one of fp8, fp8-rowwise, fp8-rowwise-gw-hp, "
        "e.g. fp8:keep-ends"]


def test_the_cli_report_shows_the_attention_in_bf16(tmp_path):
    out, traces = tmp_path / "r.json", tmp_path / "traces"
    run = _cli(["profile", "--model", "tiny", "--precision", "fp8,fp8:keep-attn",
                "--batch-size", "1", "--seq-len", "16", "--steps", "1", "--warmup", "0",
                "--device", "cpu", "--isolation", "inline", "--quiet", "--out", str(out),
                "--trace", str(traces)], tmp_path)
    assert run.returncode == 0, run.stderr
    trials = {t["precision"]: t for t in json.loads(out.read_text())["trials"]}
    for label, attention in (("fp8", "fp8"), ("fp8:keep-attn", "bf16")):
        trial = trials[label]
        assert trial["status"] == "ok", trial["reason"]
        linears = {m["name"]: m["matmul_dtype"] for m in trial["module_tree"]
                   if m["type"] in ("Linear", "Float8Linear")}
        assert linears["lm_head"] == "bf16"
        blocks = {n: d for n, d in linears.items() if n.startswith("transformer.h.")}
        assert blocks and all(d == (attention if ".attn." in n else "fp8")
                              for n, d in blocks.items())
    assert "attention blocks keep their Linear layers" in trials["fp8:keep-attn"]["recipe"]
    # the HTML report's module tree: a "matmuls in" column, read row by row
    page = render_html(read_json(out))
    rows = re.findall(r"<tr><td><span[^>]*>([^<]+)</span></td>(?:(?!</tr>).)*"
                      r"<td>([^<]+)</td></tr>", page)
    assert "<th>matmuls in</th>" in page
    assert ("transformer.h.0.attn.c_attn", "bf16") in rows
    assert ("transformer.h.0.attn.c_attn", "fp8") in rows  # the plain fp8 trial
    assert ("transformer.h.0.mlp.c_fc", "fp8") in rows
    assert ("transformer.h.0", "bf16, fp8") in rows
    # no ':' in a file name (Windows reads it as a stream of another file)
    assert sorted(p.name for p in traces.iterdir()) == ["fp8.trace.json",
                                                        "fp8_keep-attn.trace.json"]
