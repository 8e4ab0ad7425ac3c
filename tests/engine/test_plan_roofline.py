"""plan's roofline: the step takes the longer of its FLOPs at each dtype's peak and its
bytes moved at the card's memory bandwidth, both read from resources/peak_flops.json."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers as tf

from engine.measure.traffic import ByteCounter

ROOT = Path(__file__).resolve().parents[2]
TABLE = json.loads((ROOT / "resources" / "peak_flops.json").read_text(encoding="utf-8"))


def test_bytes_moved_reads_inputs_and_writes_outputs_once_per_op():
    a, b = torch.randn(8, 16), torch.randn(16, 4, dtype=torch.float32)
    with ByteCounter() as counter:
        a @ b  # reads 8x16 and 16x4, writes 8x4, fp32
    assert counter.bytes_moved == 4 * (8 * 16 + 16 * 4 + 8 * 4)
    with ByteCounter() as counter:
        a.view(16, 8).t()  # views move nothing
        a.add_(1.0)  # read and written back
        torch.empty(1000)  # an allocation nothing has written
        a.to(torch.bfloat16)  # fp32 read, bf16 written
    assert counter.bytes_moved == 4 * 128 * 2 + (4 + 2) * 128


def test_every_card_has_a_sourced_memory_bandwidth():
    for gpu in TABLE["gpus"]:
        rows = [gpu] if gpu["memory_bandwidth_tbps"] is not None else gpu["memory_variants"]
        for row in rows:
            assert row["memory_bandwidth_tbps"] > 0, gpu["name"]
            assert "B/s" in row["memory_bandwidth_source"], gpu["name"]


def _row(card: str) -> tuple[dict, dict]:
    """The table row a card name matches, and the row its bandwidth is on."""
    import re

    gpu = next(g for g in TABLE["gpus"] if re.search(g["match"], card, re.IGNORECASE))
    if gpu["memory_bandwidth_tbps"] is not None:
        return gpu, gpu
    return gpu, next(v for v in gpu["memory_variants"] if re.search(v["match"], card))


FAMILIES = {
    "llama": lambda: tf.LlamaConfig(hidden_size=1024, intermediate_size=2816,
                                    num_hidden_layers=1, num_attention_heads=8,
                                    num_key_value_heads=2, vocab_size=512,
                                    max_position_embeddings=512),
    "gpt2": lambda: tf.GPT2Config(n_embd=1024, n_layer=1, n_head=8, vocab_size=512,
                                  n_positions=512, bos_token_id=0, eos_token_id=0),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_cli_roofline_takes_the_slower_of_compute_and_memory(tmp_path, family):
    """1024-wide, one layer, fp32, 4 x 256 tokens: the A30's fp32 rate is low beside its
    bandwidth (compute-bound), the H100's is high (memory-bound); the A100 needs its size
    for its bandwidth. Each bound is worked out here from the table and the step's counts."""
    FAMILIES[family]().save_pretrained(tmp_path / family)
    cards = ["A30", "H100 SXM", "A100-SXM4-80GB"]
    run = subprocess.run([sys.executable, "main.py", "plan", "--model", str(tmp_path / family),
                          "--precision", "fp32", "--batch-size", "4", "--seq-len", "256",
                          "--card", ",".join(cards), "--max-batch", "0", "--no-history",
                          "--json", "--quiet"], cwd=ROOT, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr
    trial = json.loads(run.stdout)["trials"][0]
    flops, moved = trial["flops_by_peak_dtype"], trial["bytes_moved"]
    assert set(flops) == {"fp32"} and moved > 0
    bounds = {}
    for card, verdict in zip(cards, trial["cards"], strict=True):
        gpu, bandwidth_row = _row(card)
        compute_ms = flops["fp32"] / (gpu["peak_tflops"]["fp32"] * 1e12) * 1e3
        memory_ms = moved / (bandwidth_row["memory_bandwidth_tbps"] * 1e12) * 1e3
        bound = "compute" if compute_ms >= memory_ms else "memory"
        assert verdict["compute_ms"] == pytest.approx(compute_ms, rel=1e-9)
        assert verdict["memory_ms"] == pytest.approx(memory_ms, rel=1e-9)
        assert verdict["bound"] == bound
        assert verdict["predicted_step_ms"] == pytest.approx(max(compute_ms, memory_ms))
        assert verdict["prediction_model"].startswith(f"prediction (roofline, {bound}-bound")
        assert bandwidth_row["memory_bandwidth_source"] in verdict["prediction_model"]
        bounds[card] = bound
    assert bounds["A30"] == "compute" and bounds["H100 SXM"] == "memory"
