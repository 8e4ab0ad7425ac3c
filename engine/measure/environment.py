"""The environment a report was measured in: libraries, platform, device."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import platform
import sys

from engine import VERSION
from engine.measure.device import DeviceInfo

LIBRARIES = ("torch", "transformers", "bitsandbytes", "peft", "torchao", "accelerate",
             "nvidia-ml-py", "numpy")


def library_versions() -> dict[str, str | None]:
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def collect(info: DeviceInfo) -> dict:
    import torch

    device = dataclasses.asdict(info)
    device["description"] = info.describe()
    return {
        "ampscope": VERSION,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": platform.node(),
        "torch_cuda": torch.version.cuda,
        "libraries": library_versions(),
        "device": device,
    }
