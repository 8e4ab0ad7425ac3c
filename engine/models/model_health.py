"""Check a model before any trial loads it: one clear line instead of a traceback.

A model folder can break transformers in ways that would otherwise surface in every
trial (or as a traceback in ``footprint`` and ``numerics``): a config.json that is not
JSON, a model type this transformers does not know, an architecture without a
training head, weights cut short or shaped for another config. Each becomes a
``ValueError`` that names the file and what to do, never transformers' advice to
upgrade the pinned library.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import TYPE_CHECKING

from engine.measure.device import DeviceInfo, probe
from engine.models.load import ModelSource, load_config, max_positions, model_class, resolve_source

if TYPE_CHECKING:
    from engine.core.config import RunConfig

_UPGRADE = re.compile(r"[^.]*(pip install|upgrade|--upgrade|install from source)[^.]*\.?",
                      re.IGNORECASE)


def one_line(exc: BaseException) -> str:
    """An exception as one line, without library advice to upgrade."""
    text = " ".join(str(exc).split())
    text = _UPGRADE.sub("", text).strip() or type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "…"


def _config(source: ModelSource, trust_remote_code: bool):
    try:
        return load_config(source, trust_remote_code)
    except ValueError as exc:
        if "trust_remote_code" in str(exc) or "custom code" in str(exc):
            raise _remote_code(source) from None
        if "\n" not in str(exc) and not _UPGRADE.search(str(exc)):
            raise  # already one sentence with the fix (engine.models.load)
        raise ValueError(f"transformers cannot read the config of {source.ref}: "
                         f"{one_line(exc)}") from None
    except Exception as exc:  # transformers raises OSError, KeyError, ... for bad folders
        if "trust_remote_code" in str(exc) or "custom code" in str(exc):
            raise _remote_code(source) from None
        where = Path(source.ref) / "config.json" if source.kind == "folder" else source.ref
        if "valid JSON" in str(exc):
            raise ValueError(f"{where} is not valid JSON: fix it or save the model again "
                             "with save_pretrained") from None
        raise ValueError(f"transformers cannot read the config {where}: {one_line(exc)}") \
            from None


def _remote_code(source: ModelSource) -> ValueError:
    return ValueError(
        f"'{source.ref}' runs its own code: pass --trust-remote-code (or tick "
        "'Trust remote code') only if you trust its authors"
    )


def _check_head(source: ModelSource, config, task: str, trust_remote_code: bool) -> None:
    cls = model_class(task)
    auto_map = getattr(config, "auto_map", None) or {}
    if trust_remote_code and cls.__name__ in auto_map:
        return
    if type(config) in cls._model_mapping:
        return
    archs = ", ".join(getattr(config, "architectures", None) or []) or "no architecture named"
    head = "masked-LM" if task == "masked-lm" else "causal-LM"
    raise ValueError(
        f"{source.ref} is a '{config.model_type}' model ({archs}) with no {head} training "
        f"head transformers can build ({cls.__name__}): AmpScope trains language models, so "
        "pick a model with a ...ForCausalLM or ...ForMaskedLM architecture"
    )


def _safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor shapes from a safetensors header; ValueError when the file is cut short."""
    size = path.stat().st_size
    damaged = f"weights file {path} is damaged or cut short"
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise ValueError(f"{damaged} (no header): download or save it again")
        header_len = struct.unpack("<Q", raw)[0]
        if header_len > size - 8:
            raise ValueError(f"{damaged} (header longer than the file): download or save "
                             "it again")
        try:
            header = json.loads(fh.read(header_len))
        except ValueError:
            raise ValueError(f"{damaged} (unreadable header): download or save it again") \
                from None
    shapes, end = {}, 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        shapes[name] = tuple(info["shape"])
        end = max(end, info["data_offsets"][1])
    if 8 + header_len + end > size:
        raise ValueError(f"{damaged} ({size:,} bytes, its header describes "
                         f"{8 + header_len + end:,}): download or save it again")
    return shapes


def _check_weights(source: ModelSource, config, task: str, trust_remote_code: bool) -> None:
    folder = Path(source.ref)
    files = []
    if (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    elif (folder / "model.safetensors.index.json").is_file():
        try:
            index = json.loads((folder / "model.safetensors.index.json").read_text())
            files = sorted({folder / f for f in index["weight_map"].values()})
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ValueError(f"{folder / 'model.safetensors.index.json'} is damaged: save the "
                             "model again") from None
    if not files:
        return  # pytorch_model.bin is checked by transformers when it loads
    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        if not f.is_file():
            raise ValueError(f"weights file {f} listed in the index is missing: download or "
                             "save the model again")
        shapes.update(_safetensors_shapes(f))
    import torch

    with torch.device("meta"):
        model = model_class(task).from_config(config, trust_remote_code=trust_remote_code)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    for name, shape in shapes.items():
        want = expected.get(name)
        if want is not None and want != shape:
            raise ValueError(
                f"weights in {folder} do not fit its config.json: {name} is {list(shape)} "
                f"in the file but {list(want)} by the config: use the config the weights "
                "were saved with"
            )


def check_model(model: str, seq_len: int, trust_remote_code: bool = False):
    """Raise ``ValueError`` (one line, with the fix) if ``model`` cannot be trained here."""
    source = resolve_source(model)
    config, task = _config(source, trust_remote_code)
    limit = max_positions(config)
    if limit is not None and seq_len > limit:
        raise ValueError(
            f"sequence length {seq_len} is longer than {model} allows "
            f"({limit} positions): set --seq-len {limit} or less"
        )
    if source.kind != "preset":
        _check_head(source, config, task, trust_remote_code)
    if source.kind == "folder":
        _check_weights(source, config, task, trust_remote_code)
    return config, task


def preflight(config: RunConfig) -> DeviceInfo:
    """Check what can be checked before loading anything; raises ``ValueError``. Here, below
    the runner and the numerics lab, so both reach it going down."""
    info = probe(config.device)
    check_model(config.model, config.seq_len, config.trust_remote_code)
    return info
