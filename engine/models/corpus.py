"""What trials train on: a stream of token ids and its name (DESIGN 24).

Uniform random tokens cannot fall below ln(vocab), so by default trials train on English
that every Python install ships: the CPython docs' topic texts (``pydoc_data.topics``,
about 465 KB). The other source is a user's file: UTF-8 text, or token ids already made
for the model (nanoGPT's raw uint16 ``train.bin``, a 1-D integer ``.npy``). Text goes
through the model's own tokenizer where its source has one, otherwise it is UTF-8 bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from engine.core.config import DATA_DOCS, DATA_HINT
from engine.models.load import ModelSource

DOCS_NAME = "pydoc_data.topics (CPython docs)"
# files that say a model folder (or a cached hub snapshot) carries a tokenizer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                   "vocab.txt", "spiece.model")
_CHECK_CHUNK = 1 << 24  # ids checked at a time: a token file may be larger than the memory


@dataclass(frozen=True, eq=False)
class TokenStream:
    ids: np.ndarray  # 1-D integer ids; a token file's stays mapped, not read whole
    name: str  # DOCS_NAME, or the file's name and size
    tokenisation: str  # "byte-level", the model's tokenizer, or a token file's id type


@cache
def token_stream(data: str, source: ModelSource, vocab: int,
                 trust_remote_code: bool = False) -> TokenStream:
    """The stream ``data`` (DATA_DOCS or a file's path) holds for a model with ``vocab``
    ids; once per process. Raises ``ValueError`` (one line, with the fix) for a file that
    cannot be read as text or token ids."""
    if data == DATA_DOCS:
        ids, how = _tokenise(_docs_text(), source, vocab, trust_remote_code)
        return TokenStream(ids, DOCS_NAME, how)
    path = Path(data)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ValueError(f"data file {path} cannot be read ({exc.strerror}): {DATA_HINT}") \
            from None
    name = f"{path.name} ({size:,} bytes)"
    suffix = path.suffix.lower()
    if suffix == ".bin":
        if size % 2:
            raise ValueError(f"data file {path} ({size:,} bytes) is not a whole number of "
                             "uint16 token ids: a .bin holds nanoGPT's raw uint16 ids; pass "
                             "text under another name")
        return TokenStream(_mapped(path), name, "uint16 token ids (nanoGPT .bin)")
    if suffix == ".npy":
        ids = _npy(path)
        return TokenStream(ids, name, f"{ids.dtype} token ids (.npy)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"data file {path} is not UTF-8 text (byte {exc.start:,}): "
                         f"{DATA_HINT}") from None
    except OSError as exc:
        raise ValueError(f"data file {path} cannot be read ({exc.strerror}): {DATA_HINT}") \
            from None
    if not text.strip():
        raise ValueError(f"data file {path} holds no text: {DATA_HINT}")
    ids, how = _tokenise(text, source, vocab, trust_remote_code)
    return TokenStream(ids, name, how)


def check_ids(stream: TokenStream, vocab: int) -> None:
    """Raise ``ValueError`` unless every id fits the model's embedding (a token file made
    for another tokenizer would fail inside the first step instead)."""
    ids = stream.ids
    for start in range(0, len(ids), _CHECK_CHUNK):
        chunk = np.asarray(ids[start:start + _CHECK_CHUNK])
        bad = np.flatnonzero((chunk < 0) | (chunk >= vocab))
        if bad.size:
            at = start + int(bad[0])
            raise ValueError(f"data file {stream.name}: token id {int(ids[at])} (at position "
                             f"{at:,}) is outside the model's vocabulary of {vocab:,} ids: use "
                             "ids made with this model's tokenizer, or a text file")


@cache
def _docs_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))  # sorted: the same every run


def _tokenise(text: str, source: ModelSource, vocab: int,
              trust_remote_code: bool) -> tuple[np.ndarray, str]:
    tokenizer = _tokenizer(source, trust_remote_code)
    if tokenizer is not None:
        # verbose=False: the whole text is far longer than the model's context, on purpose
        ids = np.asarray(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"],
                         dtype=np.int64)
        if ids.size and ids.min() >= 0 and ids.max() < vocab:
            return ids, f"the model's tokenizer ({type(tokenizer).__name__})"
    ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)
    if vocab < 256:  # a vocabulary smaller than a byte still sees every byte, folded
        return ids % vocab, f"byte-level (UTF-8 bytes mod {vocab})"
    return ids, "byte-level (UTF-8 bytes)"


def _tokenizer(source: ModelSource, trust_remote_code: bool):
    """The model's tokenizer, from local files only; None where its source has none (the
    presets build from configs) or it cannot be loaded offline."""
    if source.kind == "preset":
        return None
    if source.kind == "folder" and not any((Path(source.ref) / f).is_file()
                                           for f in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source.ref, local_files_only=True,
                                             trust_remote_code=trust_remote_code)
    except Exception:  # none cached, or one this transformers cannot read: bytes, named so
        return None


def _mapped(path: Path) -> np.ndarray:
    try:
        return np.memmap(path, dtype=np.uint16, mode="r")
    except (OSError, ValueError) as exc:
        raise ValueError(f"data file {path} cannot be read ({exc}): {DATA_HINT}") from None


def _npy(path: Path) -> np.ndarray:
    try:
        ids = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError):
        raise ValueError(f"data file {path} is not a NumPy array file: save token ids with "
                         "numpy.save, or give a text file another suffix") from None
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise ValueError(f"data file {path} holds a {ids.ndim}-D {ids.dtype} array: a .npy "
                         "must hold a 1-D integer array of token ids")
    return ids
