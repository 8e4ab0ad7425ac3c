"""Calibrate the per-layer activation model (engine.models.memory_model) against the tracker.

For each architecture family, activation mode (fp32; half autocast as the CPU casts and as
CUDA casts; pure half) and attention
implementation (eager; sdpa), builds tiny models of several shapes, runs one forward
under engine.measure.memtrack and records the bytes the forward saved for backward (the
activations alive when backward begins). A least-squares fit over those shapes gives
bytes per token for each piece of a layer (hidden, heads x head_dim, key/value width,
MLP width, attention scores, per-head statistics) and of the outer model (embeddings,
final norm, logits and loss). Layer and outer parts are told apart by running each
shape at two depths.

    python3 scripts/calibrate_activations.py   # a few minutes on 2 CPU cores
    python3 scripts/calibrate_activations.py --families gpt2,gpt_neox   # refit these only
    python3 scripts/calibrate_activations.py --modes amp-cuda   # CUDA's autocast only

writes resources/activation_calibration.json, with the torch and transformers versions it
was measured with and the fit's worst residual per family (``--families`` keeps the other
families' stored fits, and the fitted terms of scripts/memory_error_table.py).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.measure.memtrack import MemoryWatcher  # noqa: E402
from engine.models.load import dims, make_batches, model_class, task_of  # noqa: E402
from engine.models.memory_model import LAYER_BASIS, OUTER_BASIS, basis_values  # noqa: E402
from engine.run.plan_autocast import CudaAutocast  # noqa: E402

OUT = ROOT / "resources" / "activation_calibration.json"
FAMILIES = ("llama", "qwen2", "mistral", "bert", "gpt2", "opt", "gpt_neox", "t5", "bart")
# mode -> (weight dtype, autocast dtype)
MODES = {"fp32": (torch.float32, None), "amp": (torch.float32, torch.bfloat16),
         "amp-cuda": (torch.float32, torch.bfloat16), "half": (torch.bfloat16, None)}
# modes whose autocast casts as CUDA's does (engine.run.plan_autocast.CudaAutocast over the
# CPU's autocast region): CUDA keeps pow, exp, layer_norm, softmax... in fp32, so a card
# saves more for backward than the CPU under the same recipe. What it leaves alive is what
# the H200 measured for GPT-2 (tests/engine/test_plan_h200.py); the plan's trace uses it
CUDA_MODES = ("amp-cuda",)
ATTENTION = ("eager", "sdpa")


def build(family: str, h: int, heads: int, head_dim: int, kv: int, f: int, layers: tuple,
          vocab: int):
    """A dropout-free config of ``family`` (``layers``: (encoder, decoder) or (n,)), with
    no key/value cache, as training loads it (engine.models.load): GPT-2's cache keeps
    another copy of each layer's keys and values alive, GPT-NeoX's one fewer."""
    config = _config(family, h, heads, head_dim, kv, f, layers, vocab)
    config.use_cache = False
    return config


def _config(family: str, h: int, heads: int, head_dim: int, kv: int, f: int, layers: tuple,
            vocab: int):
    import transformers as tf

    n = layers[0]
    common = dict(vocab_size=vocab, max_position_embeddings=256)
    if family in ("llama", "qwen2", "mistral"):
        cls = {"llama": tf.LlamaConfig, "qwen2": tf.Qwen2Config, "mistral": tf.MistralConfig}
        kw = dict(hidden_size=h, intermediate_size=f, num_hidden_layers=n,
                  num_attention_heads=heads, num_key_value_heads=kv, **common)
        if family != "qwen2":
            kw["head_dim"] = head_dim
        return cls[family](**kw)
    if family == "bert":
        return tf.BertConfig(hidden_size=h, intermediate_size=f, num_hidden_layers=n,
                             num_attention_heads=heads, hidden_dropout_prob=0.0,
                             attention_probs_dropout_prob=0.0, **common)
    if family == "gpt2":
        return tf.GPT2Config(n_embd=h, n_layer=n, n_head=heads, n_inner=f, vocab_size=vocab,
                             n_positions=256, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    if family == "opt":
        return tf.OPTConfig(hidden_size=h, ffn_dim=f, num_hidden_layers=n,
                            num_attention_heads=heads, word_embed_proj_dim=h, dropout=0.0,
                            attention_dropout=0.0, **common)
    if family == "gpt_neox":
        return tf.GPTNeoXConfig(hidden_size=h, intermediate_size=f, num_hidden_layers=n,
                                num_attention_heads=heads, hidden_dropout=0.0,
                                attention_dropout=0.0, **common)
    if family == "t5":
        return tf.T5Config(d_model=h, d_ff=f, num_layers=n, num_decoder_layers=layers[1],
                           num_heads=heads, d_kv=head_dim, vocab_size=vocab, dropout_rate=0.0)
    if family == "bart":
        return tf.BartConfig(d_model=h, encoder_ffn_dim=f, decoder_ffn_dim=f, encoder_layers=n,
                             decoder_layers=layers[1], encoder_attention_heads=heads,
                             decoder_attention_heads=heads, dropout=0.0, attention_dropout=0.0,
                             activation_dropout=0.0, **common)
    raise ValueError(family)


def saved_bytes(config, attention: str, mode: str, batch: int, seq: int) -> int:
    weights, half = MODES[mode]
    task = task_of(config)
    torch.manual_seed(0)
    model = model_class(task).from_config(config, attn_implementation=attention, dtype=weights)
    model.train()
    data = make_batches(config, task, batch, seq, 1, 0, "cpu")[0]
    watcher = MemoryWatcher("cpu")
    watcher.track_training(model, None, data)
    cuda = CudaAutocast() if mode in CUDA_MODES else nullcontext()
    with watcher, torch.autocast("cpu", dtype=half or torch.float32,
                                 enabled=half is not None), cuda:
        # as a training step holds it: the loss (and through it what the graph saved);
        # the model's other outputs, the logits among them, are dropped
        loss = model(**data).loss
        held = watcher.live()["activations"]
    del loss
    return held


def shapes(family: str, rng: random.Random) -> list[dict]:
    out = []
    explicit = family in ("llama", "mistral", "t5")  # head_dim set apart from hidden / heads
    for _ in range(14):
        heads = rng.choice((2, 4, 8))
        head_dim = rng.choice((8, 16, 32))
        h = heads * rng.choice((8, 16, 32)) if explicit else heads * head_dim
        kv = rng.choice([k for k in (1, 2, heads) if heads % k == 0]) \
            if family in ("llama", "qwen2", "mistral") else heads
        out.append(dict(h=h, heads=heads, head_dim=head_dim if explicit else h // heads, kv=kv,
                        f=rng.choice((64, 128, 256, 384)), vocab=rng.choice((128, 512, 1024)),
                        batch=rng.choice((1, 2, 3)), seq=rng.choice((16, 32, 64))))
    return out


def fit(family: str, mode: str, attention: str, rng: random.Random) -> dict:
    enc_dec = family in ("t5", "bart")
    depths = [(1, 1), (2, 1), (1, 2)] if enc_dec else [(1,), (2,)]
    rows, targets = [], []
    for shp in shapes(family, rng):
        for layers in depths:
            config = build(family, shp["h"], shp["heads"], shp["head_dim"], shp["kv"], shp["f"],
                           layers, shp["vocab"])
            d = dims(config)
            tokens = shp["batch"] * shp["seq"]
            x = basis_values(d, shp["seq"], shp["batch"])
            layer_cols = [v * n for n in layers for v in x["layer"]]
            rows.append(layer_cols + x["outer"])
            targets.append(saved_bytes(config, attention, mode, shp["batch"], shp["seq"])
                           / tokens)
    a, b = np.array(rows, dtype=float), np.array(targets)
    coef, *_ = np.linalg.lstsq(a, b, rcond=None)
    worst = float(np.max(np.abs(a @ coef - b) / b))
    k = len(LAYER_BASIS)
    stacks = ("encoder_layer", "decoder_layer") if enc_dec else ("layer",)
    result = {name: [round(float(c), 3) for c in coef[i * k:(i + 1) * k]]
              for i, name in enumerate(stacks)}
    result["outer"] = [round(float(c), 3) for c in coef[len(stacks) * k:]]
    result["worst_residual"] = round(worst, 4)
    return result


def main() -> None:
    import transformers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(FAMILIES),
                        help="families to refit (the others keep their stored fit)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="activation modes to refit (the others keep their stored fit)")
    args = parser.parse_args()
    chosen, modes = args.families.split(","), args.modes.split(",")
    for given, known in ((chosen, FAMILIES), (modes, tuple(MODES))):
        unknown = sorted(set(given) - set(known))
        if unknown:
            parser.error(f"unknown {unknown}: choose from {', '.join(known)}")
    stored = json.loads(OUT.read_text(encoding="utf-8")) if OUT.exists() else {}
    table = stored.get("families", {})
    torch.set_num_threads(1)
    for family in chosen:
        for mode in modes:
            # one generator per family and mode: its shapes do not depend on what else runs
            rng = random.Random(f"{family}/{mode}")
            for attention in ATTENTION:
                table.setdefault(family, {}).setdefault(mode, {})[attention] = fit(
                    family, mode, attention, rng)
                print(family, mode, attention, table[family][mode][attention]["worst_residual"],
                      flush=True)
    stored.update({
        "_note": "bytes per token of the activations one forward saves for backward, per "
                 "layer and outside the layers; written by scripts/calibrate_activations.py",
        "torch": torch.__version__, "transformers": transformers.__version__,
        "layer_basis": list(LAYER_BASIS), "outer_basis": list(OUTER_BASIS),
        "families": table,
    })
    OUT.write_text(json.dumps(stored, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
