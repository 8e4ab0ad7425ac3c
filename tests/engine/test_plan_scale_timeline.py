"""engine.run.plan_scale_timeline: a scaled plan's memory timeline equals the timeline of
the model traced whole (``--full-trace``), through the command line's parser and handler,
on a model whose layers are alike, one alternating local and global attention and a
mixture-of-experts one whose first layer is dense; with gradient checkpointing, each
layer's recompute is a phase."""

import itertools
import json
import re
from pathlib import Path

import pytest
import transformers as tf

from tests.cli_in_process import run_cli
from tests.engine.test_plan_scale import TINY

CONFIGS = {
    "llama": lambda: tf.LlamaConfig(num_hidden_layers=6, **TINY),
    "gemma2-local-global": lambda: tf.Gemma2Config(num_hidden_layers=10, head_dim=16,
                                                   sliding_window=16, **TINY),
    "qwen2-moe-dense-first": lambda: tf.Qwen2MoeConfig(
        num_hidden_layers=6, moe_intermediate_size=32, shared_expert_intermediate_size=64,
        num_experts=4, num_experts_per_tok=2, mlp_only_layers=[0], **TINY),
}


def _plan(folder: Path, recipes: str, *extra: str) -> list[dict]:
    # the command's own parser and handler in this process: the subject is its figures
    run = run_cli("plan", "--model", str(folder), "--precision", recipes, "--seq-len", "32",
                  "--batch-size", "2", "--card", "RTX 4090", "--max-batch", "0",
                  "--no-history", "--no-levers", "--json", "--quiet", *extra)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)["trials"]


def _segments(timeline: dict) -> list[str]:
    return [k for k, _ in itertools.groupby(p["phase"] for p in timeline["points"])]


def _layers(timeline: dict) -> set[str]:
    """The decoder layers named (a LoRA model's under base_model.model.)."""
    return {m.group(1) for p in timeline["points"]
            if (m := re.search(r"model\.layers\.(\d+)", p["module"] or ""))}


@pytest.mark.parametrize(("family", "recipes", "extra"), [
    ("llama", "fp32,nf4", ()),
    ("llama", "bf16-amp", ("--grad-checkpointing",)),
    ("gemma2-local-global", "bf16-amp", ()),
    ("qwen2-moe-dense-first", "fp32,int8", ()),
])
def test_cli_scaled_timeline_equals_the_full_trace(tmp_path, family, recipes, extra):
    config = CONFIGS[family]()
    config.save_pretrained(tmp_path)
    scaled = _plan(tmp_path, recipes, *extra)
    full = _plan(tmp_path, recipes, "--full-trace", *extra)
    for s, f in zip(scaled, full, strict=True):
        assert s["scaling"].startswith("scaled"), s["scaling"]
        st, ft = s["memory_timeline"], f["memory_timeline"]
        # the same moments kept: every point's bytes, phase, module and place in the step
        assert len(st["points"]) == len(ft["points"]) and st["changes"] == ft["changes"]
        assert _segments(st) == _segments(ft)
        assert st["ops"] == ft["ops"] and st["peak_index"] == ft["peak_index"]
        for sp, fp in zip(st["points"], ft["points"], strict=True):
            assert (sp["op_index"], sp["phase"], sp["module"]) == \
                (fp["op_index"], fp["phase"], fp["module"])
            for a, b in zip(sp["category_bytes"], fp["category_bytes"], strict=True):
                assert abs(a - b) <= 0.005 * max(b, 1), (s["precision"], sp, fp)
        # the scaled peak is the table's, its categories the table's at the peak
        totals = [sum(p["category_bytes"]) for p in st["points"]]
        assert max(totals) == st["peak_bytes"] == s["memory"]["total_bytes"]
        at_peak = dict(zip(st["categories"], st["points"][st["peak_index"]]["category_bytes"],
                           strict=True))
        assert at_peak == {c: s["memory"][f"{c}_bytes"] or 0 for c in st["categories"]}
        # every layer of the full model is named where its forward made bytes
        assert _layers(st) == _layers(ft) == {str(i) for i in range(config.num_hidden_layers)}
        if extra:
            recomputes = [p for p in _segments(st) if p.startswith("recompute")]
            assert len(recomputes) == config.num_hidden_layers
