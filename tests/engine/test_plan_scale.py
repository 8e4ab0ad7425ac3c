"""engine.run.plan_scale: the plan scaled from cut models equals the plan traced whole
(``--full-trace``), recipe by recipe, on models whose layers are alike, alternate local and
global attention, or begin with dense layers before mixture-of-experts ones."""

import json

import pytest
import transformers as tf

from engine.run.plan_layers import cut_config, find_pattern
from tests.cli_in_process import run_cli

TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=256)
# every layer alike; local and global attention alternating (a window shorter than the
# sequence, so the two kinds differ); a dense first layer before mixture-of-experts ones
CONFIGS = {
    "llama": lambda: tf.LlamaConfig(num_hidden_layers=6, **TINY),
    "gemma2-local-global": lambda: tf.Gemma2Config(num_hidden_layers=12, head_dim=16,
                                                   sliding_window=16, **TINY),
    "qwen2-moe-dense-first": lambda: tf.Qwen2MoeConfig(
        num_hidden_layers=7, moe_intermediate_size=32, shared_expert_intermediate_size=64,
        num_experts=4, num_experts_per_tok=2, mlp_only_layers=[0], **TINY),
}
RECIPES = "fp32,bf16-amp,int8,nf4"
SEQ = 32  # longer than the local window: local attention is not global here
FIELDS = ("params_bytes", "buffers_bytes", "quant_state_bytes", "grads_bytes",
          "optimizer_bytes", "inputs_bytes", "weight_copies_bytes", "activations_bytes",
          "temporaries_bytes")


def _plan(folder: str, *extra: str) -> dict:
    # the command's own parser and handler in this process: the subject is its figures
    run = run_cli("plan", "--model", folder, "--precision", RECIPES, "--seq-len", str(SEQ),
                  "--batch-size", "2", "--card", "RTX 4090", "--max-batch", "0",
                  "--no-history", "--no-levers", "--json", "--quiet", *extra)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def _within(a: float, b: float, of: float) -> bool:
    return abs(a - b) <= 0.005 * of


@pytest.mark.parametrize("family", list(CONFIGS))
def test_cli_scaled_plan_equals_the_full_trace(tmp_path, family):
    config = CONFIGS[family]()
    config.save_pretrained(tmp_path / family)
    folder = str(tmp_path / family)
    scaled, full = _plan(folder), _plan(folder, "--full-trace")
    layers = config.num_hidden_layers
    for s, f in zip(scaled["trials"], full["trials"], strict=True):
        assert s["method"] == f["method"] == "traced", (s["reason"], f["reason"])
        # the cuts keep the leading dense layer and whole local/global pairs
        assert s["scaling"].startswith("scaled: traced the model cut to"), s["scaling"]
        assert f"of its {layers} layers" in s["scaling"]
        assert f["scaling"] == "traced whole: --full-trace"
        sm, fm = s["memory"], f["memory"]
        peak = fm["total_bytes"]
        assert _within(sm["total_bytes"], peak, peak), s["precision"]
        assert sm["peak_phase"] == fm["peak_phase"]
        for name in FIELDS:
            assert _within(sm[name] or 0, fm[name] or 0, peak), (s["precision"], name)
        for phase, cats in fm["at_phase_start_bytes"].items():
            for cat, value in cats.items():
                got = sm["at_phase_start_bytes"][phase][cat]
                assert _within(got, value, peak), (s["precision"], phase, cat)
        assert s["flops_by_peak_dtype"].keys() == f["flops_by_peak_dtype"].keys()
        for dtype, value in f["flops_by_peak_dtype"].items():
            assert _within(s["flops_by_peak_dtype"][dtype], value, value)
        assert _within(s["bytes_moved"], f["bytes_moved"], f["bytes_moved"])
        # the card's verdict
        for sc, fc in zip(s["cards"], f["cards"], strict=True):
            assert sc["fits"] == fc["fits"]


def test_layers_that_do_not_repeat_are_traced_whole(tmp_path):
    kinds = ["sliding_attention", "full_attention", "full_attention", "sliding_attention",
             "sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
    config = tf.Gemma2Config(num_hidden_layers=8, head_dim=16, sliding_window=16,
                             layer_types=kinds, **TINY)
    config.save_pretrained(tmp_path / "odd")
    run = run_cli("plan", "--model", str(tmp_path / "odd"), "--precision", "fp32", "--seq-len",
                  str(SEQ), "--card", "RTX 4090", "--max-batch", "0", "--no-history",
                  "--no-levers", "--json", "--quiet")
    assert run.returncode == 0, run.stderr
    scaling = json.loads(run.stdout)["trials"][0]["scaling"]
    assert scaling.startswith("traced whole:") and "do not repeat" in scaling, scaling


def test_a_pattern_with_a_remainder_cuts_whole_periods():
    # Gemma 3's five local layers to one global, 26 layers: 4 periods and 2 left over
    kinds = [("full_attention" if (i + 1) % 6 == 0 else "sliding_attention")
             for i in range(26)]
    config = tf.Gemma2Config(num_hidden_layers=26, layer_types=kinds, **TINY)
    pattern, why = find_pattern(config, 3)
    assert why == "" and (pattern.prefix, pattern.period, pattern.repeats) == (0, 6, 4)
    cut = cut_config(config, pattern, 2)
    # two periods and the remainder, in the model's own order
    assert cut.num_hidden_layers == 14 and cut.layer_types == kinds[:14]
    dense_first = tf.Qwen2MoeConfig(num_hidden_layers=10, mlp_only_layers=[0, 1], **TINY)
    pattern, _ = find_pattern(dense_first, 3)
    assert (pattern.prefix, pattern.period, pattern.repeats) == (2, 1, 8)
    assert cut_config(dense_first, pattern, 1).mlp_only_layers == [0, 1]


def _params(h, f, layers, heads, kv_heads, vocab, experts=1):
    """A Llama or Mixtral parameter count from its config.json: embeddings and LM head, per
    layer q/k/v/o, SwiGLU's three projections per expert (and the router where there are
    experts), two RMSNorms; the final norm."""
    head_dim = h // heads
    attention = 2 * h * heads * head_dim + 2 * h * kv_heads * head_dim
    router = h * experts if experts > 1 else 0
    return 2 * vocab * h + layers * (attention + experts * 3 * h * f + router + 2 * h) + h


# config.json of meta-llama/Meta-Llama-3-70B, meta-llama/Llama-3.1-405B and
# mistralai/Mixtral-8x7B-v0.1
@pytest.mark.parametrize("preset,shape,count", [
    ("llama-3-70b", (8192, 28672, 80, 64, 8, 128256), 70_553_706_496),
    ("llama-3.1-405b", (16384, 53248, 126, 128, 8, 128256), 405_853_388_800),
    ("mixtral-8x7b", (4096, 14336, 32, 32, 8, 32000, 8), 46_702_792_704),
])
def test_cli_large_presets_are_scaled_and_hold_every_parameter(preset, shape, count):
    assert _params(*shape) == count  # the published totals
    run = run_cli("plan", "--model", preset, "--precision", "bf16-amp", "--seq-len", "2048",
                  "--card", "H100 SXM", "--max-batch", "0", "--no-history", "--no-levers",
                  "--json", "--quiet")
    assert run.returncode == 0, run.stderr
    trial = json.loads(run.stdout)["trials"][0]
    assert trial["method"] == "traced" and trial["scaling"].startswith("scaled"), trial
    mem = trial["memory"]
    # AMP keeps fp32 weights and gradients; AdamW two fp32 moments
    assert mem["at_phase_start_bytes"]["optimizer"]["params"] == 4 * count
    assert mem["at_phase_start_bytes"]["optimizer"]["grads"] == 4 * count
    assert mem["total_bytes"] >= 16 * count
    assert trial["cards"][0]["fits"] is False
