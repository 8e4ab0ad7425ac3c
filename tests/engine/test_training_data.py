"""What trials train on (DESIGN 24): the built-in text by default, a user's file with
``--data``, random tokens on request; training and held-out windows from disjoint parts of
the stream; bad files refused in one line before anything is written."""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest
import torch
import transformers as tf

from engine.core.config import RunConfig
from engine.core.events import TrainingData, from_dict
from engine.models.load import load_model, make_batches
from engine.models.training_data import describe, heldout_batches, training_batches
from engine.record.data_text import data_line
from engine.record.journal import read_run
from engine.record.run_record import RunRecord
from engine.record.validate import validate_report
from tests.cli_in_process import run_cli
from tests.engine.sample_record import make_record

SHORT = ["--device", "cpu", "--precision", "fp32", "--isolation", "inline", "--quiet",
         "--no-kernel-profile", "--no-quant-error", "--interleave", "off"]


@pytest.fixture
def profile_cli(tmp_path, monkeypatch):
    """``main.py profile`` in this process, its journal in the test's own folder (spawned
    ``profile``: test_cli_spread; a refusal by a spawned process: test_cli_output)."""
    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path / "appdata"))
    return lambda *args: run_cli("profile", *SHORT, *args)


def _rows(batches):
    return [row.tolist() for b in batches for row in b["input_ids"]]


def test_training_and_heldout_windows_lie_in_disjoint_parts_of_the_stream(tmp_path):
    # ids 0..999 in order: a window's ids say exactly where in the stream it was cut
    path = tmp_path / "ids.npy"
    np.save(path, np.arange(1000, dtype=np.int32))
    config = RunConfig(model="tiny", batch_size=3, seq_len=16, device="cpu", data=str(path))
    loaded = load_model("tiny", "fp32", "cpu")
    train = _rows(training_batches(loaded, config, 8, "cpu"))
    held = _rows(heldout_batches(loaded, config, 2, 7, "cpu"))
    held_from = 1000 - 100  # the last tenth
    for row in train + held:  # each row is one window of consecutive ids
        assert row == list(range(row[0], row[0] + 16))
    assert max(max(r) for r in train) < held_from <= min(min(r) for r in held)
    assert len({tuple(r) for r in train}) > 1  # windows at several offsets
    # by seed: the same every call, another seed other windows
    assert _rows(training_batches(loaded, config, 8, "cpu")) == train
    assert _rows(training_batches(loaded, config.replace(seed=1), 8, "cpu")) != train
    data = describe(config)
    assert (data.tokens, data.train_part_tokens, data.heldout_part_tokens) == (1000, 900, 100)
    assert data.source == "ids.npy (4,128 bytes)" and data.tokenisation == "int32 token ids (.npy)"


def test_the_default_data_is_the_python_docs_as_bytes_folded_into_a_small_vocabulary(tmp_path):
    from pydoc_data.topics import topics

    stream = "\n\n".join(topics[k] for k in sorted(topics)).encode("utf-8")
    config = RunConfig(model="tiny", batch_size=2, seq_len=32, device="cpu")
    loaded = load_model("tiny", "fp32", "cpu")
    cut = len(stream) - len(stream) // 10
    for row in _rows(training_batches(loaded, config, 4, "cpu")):
        assert bytes(row) in stream[:cut]
    for row in _rows(heldout_batches(loaded, config, 2, 5, "cpu")):
        assert bytes(row) in stream[cut:]
    data = describe(config)
    assert data.source == "pydoc_data.topics (CPython docs)" and data.tokens == len(stream)
    assert data.tokenisation == "byte-level (UTF-8 bytes)"
    # a vocabulary smaller than a byte: every byte folded into it
    small = tf.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=100, n_positions=64)
    tf.GPT2LMHeadModel(small).save_pretrained(tmp_path)
    folded = config.replace(model=str(tmp_path))
    rows = _rows(training_batches(load_model(str(tmp_path), "fp32", "cpu"), folded, 2, "cpu"))
    folded_stream = bytes(b % 100 for b in stream[:cut])
    assert all(bytes(r) in folded_stream for r in rows)
    assert describe(folded).tokenisation == "byte-level (UTF-8 bytes mod 100)"


def test_a_model_folder_with_a_tokenizer_tokenises_with_it(tmp_path):
    # a word-level tokenizer built here (no download): its ids, not bytes
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["the", "quick", "brown", "fox", "[UNK]"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tf.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(tmp_path)
    tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=5,
                                     n_positions=64)).save_pretrained(tmp_path)
    text = tmp_path / "words.txt"
    text.write_text("the quick brown fox " * 50, encoding="utf-8")
    config = RunConfig(model=str(tmp_path), batch_size=2, seq_len=8, device="cpu",
                       data=str(text))
    rows = _rows(training_batches(load_model(str(tmp_path), "fp32", "cpu"), config, 2, "cpu"))
    assert all(row == [(row[0] + i) % 4 for i in range(8)] for row in rows)
    assert describe(config).tokenisation.startswith("the model's tokenizer (")


def test_every_task_keeps_its_batch_layout_on_text():
    windows = [torch.arange(32).reshape(2, 16) + 40]
    bert = tf.BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=1,
                         num_attention_heads=2, intermediate_size=64)
    masked = make_batches(bert, "masked-lm", 2, 16, 1, 0, "cpu", windows)[0]
    targets = masked["labels"] != -100
    assert (targets.sum(dim=1) >= 1).all()
    assert torch.equal(masked["labels"][targets], windows[0][targets])
    assert (masked["input_ids"][targets] == (getattr(bert, "mask_token_id", None) or 0)).all()
    t5 = tf.T5Config(vocab_size=200, d_model=32, num_layers=1, num_heads=2, d_ff=64)
    s2s = make_batches(t5, "seq2seq-lm", 2, 16, 1, 0, "cpu", windows)[0]
    assert torch.equal(s2s["labels"], windows[0]) and torch.equal(s2s["input_ids"], windows[0])
    assert torch.equal(s2s["decoder_input_ids"][:, 1:], windows[0][:, :-1])
    causal = make_batches(tf.GPT2Config(vocab_size=200), "causal-lm", 2, 16, 1, 0, "cpu",
                          windows)[0]
    assert torch.equal(causal["input_ids"], windows[0]) and torch.equal(causal["labels"],
                                                                         windows[0])


@pytest.mark.parametrize("kind", ["text", "bin", "npy"])
def test_the_cli_trains_on_a_file_and_the_report_names_it(tmp_path, kind, profile_cli):
    if kind == "text":
        data = tmp_path / "story.txt"
        data.write_text("Once upon a time, a model learned to read. " * 60, encoding="utf-8")
        how = "byte-level (UTF-8 bytes)"
    elif kind == "bin":  # nanoGPT's train.bin: raw uint16 ids
        data = tmp_path / "train.bin"
        (np.arange(3000) % 1024).astype(np.uint16).tofile(data)
        how = "uint16 token ids (nanoGPT .bin)"
    else:
        data = tmp_path / "ids.npy"
        np.save(data, (np.arange(3000) * 7 % 1024).astype(np.int64))
        how = "int64 token ids (.npy)"
    out = tmp_path / "run.json"
    run = profile_cli("--batch-size", "2", "--seq-len", "16", "--steps", "2", "--warmup",
               "1", "--data", str(data), "--out", str(out))
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    size = data.stat().st_size
    assert report["data"]["source"] == f"{data.name} ({size:,} bytes)"
    assert report["data"]["tokenisation"] == how
    assert report["config"]["data"] == str(data.resolve())
    lines = run.stdout.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("data: "))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("  "))
    said = " ".join(x.strip() for x in lines[start:end])  # wrapped at 120 columns
    assert f"{data.name} ({size:,} bytes)" in said and "2 held-out batches (64 tokens)" in said
    assert report["trials"][0]["status"] == "ok"
    # the journal the run wrote, and the report read back, name it alike
    (journal,) = (tmp_path / "appdata").glob("runs/*.jsonl")
    assert read_run(journal).data == read_run(out).data == from_dict(TrainingData,
                                                                     report["data"])


def test_a_report_without_data_reads_as_not_recorded():
    older = json.loads(json.dumps(make_record().to_dict()))
    older.pop("data")
    validate_report(older)
    assert RunRecord.from_dict(older).data is None
    assert data_line(RunRecord.from_dict(older)) is None


@pytest.mark.parametrize(("name", "content", "says"), [
    ("ids.npy", np.array([1, 2, 5000] * 100), "token id 5000 (at position 2) is outside"),
    ("short.txt", "too short", "holds 9 tokens"),
    ("latin1.txt", "caf\xe9 au lait".encode("latin-1") * 50, "is not UTF-8 text"),
    ("empty.txt", b"", "is empty"),
    ("odd.bin", b"\x01\x00\x02", "not a whole number of uint16 token ids"),
    ("grid.npy", np.zeros((4, 4), dtype=np.int64), "holds a 2-D int64 array"),
    ("junk.npy", b"not an array", "is not a NumPy array file"),
    ("missing.txt", None, "does not exist"),
])
def test_a_bad_data_file_is_one_line_and_nothing_written(tmp_path, name, content, says,
                                                         profile_cli):
    path = tmp_path / name
    if isinstance(content, np.ndarray):
        np.save(path, content)
    elif isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    elif content is not None:
        path.write_bytes(content)
    out = tmp_path / "run.json"
    run = profile_cli("--batch-size", "2", "--seq-len", "16", "--steps", "1", "--data",
               str(path), "--out", str(out))
    assert run.returncode == 2, run.stdout
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ampscope: error: "), run.stderr
    assert says in lines[0], lines[0]
    assert not out.exists()
    assert not list((tmp_path / "appdata").glob("runs/*.jsonl"))  # no journal begun


def test_the_default_data_is_learned_within_a_short_fp32_run(tmp_path, profile_cli):
    """The held-out loss falls on the built-in text by far more than the step-to-step jitter
    of the run's own training losses (their successive differences, trend removed)."""
    out = tmp_path / "run.json"
    run = profile_cli("--model", "tiny", "--batch-size", "4", "--seq-len", "64", "--steps",
               "8", "--warmup", "1", "--out", str(out))
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    assert report["data"]["source"] == "pydoc_data.topics (CPython docs)"
    (trial,) = report["trials"]
    held = trial["heldout_loss"]
    losses = [s["loss"] for s in trial["steps"]]
    diffs = [b - a for a, b in zip(losses, losses[1:])]
    jitter = statistics.pstdev(diffs)
    drop = held["loss_before"] - held["loss_after"]
    assert drop > 3 * jitter and drop > 0, (held, losses)
