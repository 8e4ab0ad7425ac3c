"""What the chosen device can do: name, compute capability, and which precisions run.

Every recipe asks ``DeviceInfo.unsupported_reason`` before it loads anything, so a
precision the hardware lacks becomes an ``unsupported`` trial with the reason, never
a crash deep inside a kernel.
"""

from __future__ import annotations

import importlib.util
import platform
import warnings
from dataclasses import dataclass, field

import torch

from engine import nvml
from engine.config import PRECISIONS


def cuda_unavailable_reason() -> str | None:
    """Why torch finds no CUDA GPU when it says why (a driver too old for this torch).

    torch says it in a warning, which the quiet libraries filter would hide: it is
    caught here so ``--device auto`` falling back to the CPU can say so.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if torch.cuda.is_available():
            return None
    for w in caught:
        text = str(w.message)
        if "CUDA" in text or "driver" in text.lower():
            return " ".join(text.split())
    return None


def resolve_device(requested: str) -> torch.device:
    """``auto`` picks CUDA when present; an explicit ``cuda`` without CUDA is an error."""
    requested = requested.strip().lower()
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(
            "--device cuda was asked for but this machine has no usable CUDA GPU "
            f"(torch {torch.__version__}): use --device cpu, or install a CUDA build of torch"
        )
    dev = torch.device(requested)
    index = dev.index or 0
    if index >= torch.cuda.device_count():
        raise ValueError(
            f"GPU {index} does not exist (found {torch.cuda.device_count()}): "
            f"pick one of cuda:0..cuda:{torch.cuda.device_count() - 1}"
        )
    return torch.device("cuda", index)


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "cpu" or "cuda"
    index: int | None
    name: str
    compute_capability: tuple[int, int] | None
    total_memory_bytes: int | None
    cuda_version: str | None
    driver_version: str | None
    nvml_available: bool
    bf16_supported: bool
    tf32_supported: bool
    fp8_supported: bool
    unsupported: dict = field(default_factory=dict)  # precision -> reason
    fallback_reason: str | None = None  # why ``auto`` chose the CPU when a GPU may be there

    def unsupported_reason(self, precision: str) -> str | None:
        return self.unsupported.get(precision)

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cuda", self.index) if self.kind == "cuda" else torch.device("cpu")

    def describe(self) -> str:
        if self.kind == "cpu":
            return f"CPU ({self.name})"
        cc = ".".join(map(str, self.compute_capability or ()))
        return f"{self.name} (compute capability {cc}, CUDA {self.cuda_version})"


def _cpu_name() -> str:
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return name or "unknown CPU"


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def probe(requested: str = "auto") -> DeviceInfo:
    """Inspect the device ``requested`` names. Raises ``ValueError`` for impossible asks."""
    fallback = cuda_unavailable_reason() if requested.strip().lower() == "auto" else None
    dev = resolve_device(requested)
    unsupported: dict[str, str] = {}
    if not _has("bitsandbytes"):
        for p in ("int8", "nf4"):
            unsupported[p] = "bitsandbytes is not installed: pip install -r requirements.txt"
    if dev.type == "cpu":
        unsupported["tf32"] = (
            "TF32 is a Tensor Core matmul mode of NVIDIA Ampere and newer GPUs; "
            "on the CPU it would be plain fp32: run on a CUDA GPU"
        )
        unsupported["fp8"] = (
            "fp8 training (torchao float8) needs a CUDA GPU of compute capability 8.9 or "
            "newer (Ada, Hopper); this run is on the CPU"
        )
        return DeviceInfo(
            kind="cpu",
            index=None,
            name=_cpu_name(),
            compute_capability=None,
            total_memory_bytes=None,
            cuda_version=None,
            driver_version=None,
            nvml_available=nvml.available(),
            bf16_supported=True,
            tf32_supported=False,
            fp8_supported=False,
            unsupported=unsupported,
            fallback_reason=fallback,
        )
    index = dev.index or 0
    props = torch.cuda.get_device_properties(index)
    cc = (props.major, props.minor)
    name = props.name
    bf16 = cc >= (8, 0)
    tf32 = cc >= (8, 0)
    fp8 = cc >= (8, 9)
    if not bf16:
        reason = f"{name} (compute capability {cc[0]}.{cc[1]}) has no bf16 Tensor Cores: needs 8.0+"
        for p in ("bf16-amp", "bf16", "nf4"):
            unsupported[p] = reason
    if not tf32:
        unsupported["tf32"] = (
            f"{name} (compute capability {cc[0]}.{cc[1]}) has no TF32 mode: needs Ampere (8.0+)"
        )
    if not fp8:
        unsupported["fp8"] = (
            f"fp8 training needs compute capability 8.9+ (Ada, Hopper); {name} is "
            f"{cc[0]}.{cc[1]}: choose bf16-amp or fp16-amp"
        )
    elif not _has("torchao"):
        unsupported["fp8"] = "torchao is not installed: pip install -r requirements.txt"
    handle_info = nvml.device_static(index)
    return DeviceInfo(
        kind="cuda",
        index=index,
        name=name,
        compute_capability=cc,
        total_memory_bytes=int(props.total_memory),
        cuda_version=torch.version.cuda,
        driver_version=handle_info.get("driver_version"),
        nvml_available=nvml.available(),
        bf16_supported=bf16,
        tf32_supported=tf32,
        fp8_supported=fp8 and "fp8" not in unsupported,
        unsupported={p: r for p, r in unsupported.items() if p in PRECISIONS},
    )
