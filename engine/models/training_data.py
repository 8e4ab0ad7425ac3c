"""Training and held-out batches from the run's data, and the report's account of it.

A stream's last tenth (at least one window) is held out: every training window lies
wholly before it and every held-out window wholly inside it, so no step trains on a token
the held-out loss is measured on. Window offsets are drawn on the CPU by seed, so every
precision and device sees the same tokens; the batch layouts are ``make_batches``'.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.core.config import DATA_RANDOM, RunConfig
from engine.core.events import TrainingData
from engine.models.corpus import TokenStream, check_ids, token_stream
from engine.models.load import (
    LoadedModel,
    load_config,
    make_batches,
    resolve_source,
    vocab_size,
)

BATCH_POOL = 8  # distinct training batches a trial (or a rank) cycles through its steps
HELDOUT_SHARE = 10  # one token in this many, at the stream's end, is held out
RANDOM_NAME = "uniform random tokens"


def split_at(tokens: int, seq_len: int) -> int:
    """The index of the first held-out token of a stream of ``tokens``."""
    return tokens - max(seq_len, tokens // HELDOUT_SHARE)


def windows(ids: np.ndarray, start: int, end: int, count: int, batch_size: int,
            seq_len: int, seed: int) -> list[torch.Tensor]:
    """``count`` (batch_size, seq_len) id tensors, each row a window wholly inside
    ``ids[start:end]``, at offsets drawn by ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    offsets = torch.randint(start, end - seq_len + 1, (count, batch_size), generator=gen)
    # copied into torch's allocator, as randint's ids are: not a view of numpy's memory,
    # which the allocator-watching memory figures would not see
    return [torch.tensor(np.stack([np.asarray(ids[o:o + seq_len], dtype=np.int64)
                                   for o in row]))
            for row in offsets.tolist()]


def training_batches(loaded: LoadedModel, config: RunConfig, count: int,
                     device: torch.device | str, batch_size: int | None = None) -> list[dict]:
    """``count`` training batches of ``config.data`` by ``config.seed`` (``batch_size``
    rows; the config's unless given)."""
    rows = batch_size or config.batch_size
    stream = _stream(loaded, config)
    if stream is None:
        return make_batches(loaded.config, loaded.task, rows, config.seq_len, count,
                            config.seed, device)
    end = split_at(len(stream.ids), config.seq_len)
    ids = windows(stream.ids, 0, end, count, rows, config.seq_len, config.seed)
    return make_batches(loaded.config, loaded.task, rows, config.seq_len, count, config.seed,
                        device, ids)


def heldout_batches(loaded: LoadedModel, config: RunConfig, count: int, seed: int,
                    device: torch.device | str) -> list[dict]:
    """``count`` batches no training batch shares a token with: from the held-out part of
    the stream, or (random tokens) drawn with ``seed``, which training never uses."""
    stream = _stream(loaded, config)
    if stream is None:
        return make_batches(loaded.config, loaded.task, config.batch_size, config.seq_len,
                            count, seed, device)
    n = len(stream.ids)
    ids = windows(stream.ids, split_at(n, config.seq_len), n, count, config.batch_size,
                  config.seq_len, seed)
    return make_batches(loaded.config, loaded.task, config.batch_size, config.seq_len, count,
                        seed, device, ids)


def describe(config: RunConfig) -> TrainingData:
    """What the run will train on, read and checked before any trial starts: raises
    ``ValueError`` (one line, with the fix) for a file that is unreadable, holds ids the
    model does not have, or is too short for a training batch and a held-out window."""
    if config.data == DATA_RANDOM:
        return TrainingData(RANDOM_NAME, None, None, None, None,
                            f"token ids drawn uniformly from the vocabulary by seed "
                            f"{config.seed}; held-out batches by another seed")
    source = resolve_source(config.model)
    model_config, _ = load_config(source, config.trust_remote_code)
    vocab = vocab_size(model_config)
    stream = token_stream(config.data, source, vocab, config.trust_remote_code)
    check_ids(stream, vocab)
    n, seq = len(stream.ids), config.seq_len
    need = config.batch_size * seq + seq
    if n < need:
        raise ValueError(f"data {stream.name} holds {n:,} tokens ({stream.tokenisation}): one "
                         f"training batch ({config.batch_size} x {seq}) and a held-out window "
                         f"need {need:,}: use a longer file, or lower --batch-size or --seq-len")
    end = split_at(n, seq)
    return TrainingData(stream.name, stream.tokenisation, n, end, n - end,
                        f"windows of {seq} tokens at offsets drawn by seed {config.seed}: "
                        f"training windows from the first {end:,} tokens, held-out windows "
                        f"from the last {n - end:,} (no token in both)")


def _stream(loaded: LoadedModel, config: RunConfig) -> TokenStream | None:
    if config.data == DATA_RANDOM:
        return None
    return token_stream(config.data, loaded.source, vocab_size(loaded.config),
                        config.trust_remote_code)
