"""What the chosen device can do: name, compute capability, and which precisions run.

Every recipe asks ``DeviceInfo.unsupported_reason`` before it loads anything, so a
precision the hardware lacks becomes an ``unsupported`` trial with the reason, never
a crash deep inside a kernel. What the hardware can do is ``engine.measure.gating``'s verdict
(native, emulated or unsupported); this module adds what is not installed.
"""

from __future__ import annotations

import importlib.util
import platform
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from engine.core.config import BF16_EMULATED, PRECISIONS, recipe_name
from engine.core.recipes import recipe
from engine.measure import amd_smi, cpu_float8, gating, nvml


def cuda_unavailable_reason() -> str:
    """Why torch cannot use CUDA here, in torch's or the driver's own words.

    torch says it once, as a warning the first time CUDA is counted (and the app
    silences library warnings); initialising CUDA again raises the same message.
    """
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    try:
        torch.cuda.init()
    except Exception as exc:
        lines = str(exc).strip().splitlines()
        return lines[0] if lines else type(exc).__name__
    return "torch found no CUDA GPU"


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
            f"({cuda_unavailable_reason()}): use --device cpu, or install a CUDA build of "
            "torch that this driver supports"
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
    uuid: str | None = None  # as torch prints it; NVML finds the GPU by it
    pci_bus_id: str | None = None  # NVML's form, 00000000:01:00.0
    sm_count: int | None = None  # streaming multiprocessors (a MIG slice has fewer)
    mig: bool = False  # a MIG slice of a GPU, not the whole GPU
    power_method: str | None = None  # what NVML's power reading is on this GPU
    fallback_reason: str | None = None  # why --device auto chose the CPU
    # does bf16 math run on bf16 units? CPU: AVX512-BF16/AMX (x86) or BF16 (Arm);
    # False: torch emulates it in fp32, slower than fp32 itself; None: not known
    bf16_hardware: bool | None = None
    verdicts: dict = field(default_factory=dict)  # precision -> gating.Verdict
    gcn_arch: str | None = None  # an AMD GPU under torch's ROCm build ("gfx942"); else None
    hip_version: str | None = None  # torch.version.hip on a ROCm build

    @property
    def bf16_text(self) -> str:
        """The device's bf16 support in a few words, as the status bar and reports say it."""
        if not self.bf16_supported:
            return "no"
        if self.bf16_hardware is False:
            return BF16_EMULATED
        return "yes"

    def unsupported_reason(self, precision: str) -> str | None:
        return self.unsupported.get(recipe_name(precision))

    def verdict(self, precision: str) -> gating.Verdict | None:
        """The gating verdict, with "unsupported" where the probe found a missing library;
        a label with suffixes ("fp8:keep-ends+sgd") has its recipe's."""
        reason = self.unsupported_reason(precision)
        if reason is not None:
            return gating.Verdict("unsupported", reason)
        return self.verdicts.get(recipe_name(precision))

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cuda", self.index) if self.kind == "cuda" else torch.device("cpu")

    def device_context(self):
        """Make this GPU torch's current device inside a ``with`` (a no-op on the CPU).

        Events, streams and bare ``torch.cuda`` calls use the current device, which
        stays GPU 0 unless set: without this, ``cuda:1`` work would be timed on GPU 0.
        """
        return torch.cuda.device(self.index) if self.kind == "cuda" else nullcontext()

    def nvml_handle(self):
        """This GPU's NVML handle, found by UUID or PCI bus id; ``None`` without one."""
        if self.kind != "cuda":
            return None
        return nvml.handle_for(self.uuid, self.pci_bus_id)

    def telemetry(self):
        """(guarded query module, handle) of this GPU's telemetry: NVML on NVIDIA, AMD SMI
        on ROCm; the handle is ``None`` where the library does not see the GPU."""
        if self.kind != "cuda":
            return nvml, None
        if self.gcn_arch:
            return amd_smi, amd_smi.handle_for(self.pci_bus_id)
        return nvml, self.nvml_handle()

    def describe(self) -> str:
        if self.kind == "cpu":  # a CPU chosen for want of a usable GPU says why
            return f"CPU ({self.name})" + (f"; {self.fallback_reason}"
                                           if self.fallback_reason else "")
        if self.gcn_arch:
            return f"{self.name} ({self.gcn_arch}, ROCm/HIP {self.hip_version})"
        cc = ".".join(map(str, self.compute_capability or ()))
        return f"{self.name} (compute capability {cc}, CUDA {self.cuda_version})"


# bf16 matrix instructions as /proc/cpuinfo names them: x86 "flags", Arm "Features"
# (Linux kernel arch/x86/include/asm/cpufeatures.h; arch/arm64/kernel/cpuinfo.c)
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def cpu_bf16_hardware(cpuinfo: str | None) -> bool | None:
    """Whether /proc/cpuinfo's text lists a bf16 matrix instruction; None without flags."""
    flags: set[str] = set()
    for line in (cpuinfo or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    if not flags:
        return None
    return any(f in flags for f in BF16_CPU_FLAGS)


def _cpuinfo() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return None


def _cpu_name() -> str:
    for line in (_cpuinfo() or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _unsupported(verdicts: dict[str, gating.Verdict]) -> dict[str, str]:
    """Precision -> why it cannot run: the hardware's verdict, then what is not installed."""
    unsupported = {p: v.reason for p, v in verdicts.items() if v.support == "unsupported"}
    for precision in PRECISIONS:
        if precision in unsupported:
            continue
        rec = recipe(precision)
        if rec.quant and not _has("bitsandbytes"):
            unsupported[precision] = ("bitsandbytes is not installed: "
                                      "pip install -r requirements.txt")
        elif (rec.fp8 or rec.mx) and not _has("torchao"):
            unsupported[precision] = "torchao is not installed: pip install -r requirements.txt"
    return unsupported


def torchao_extension_failures() -> list[str]:
    """torchao's compiled extensions that fail to load here ("Failed to load FILE: why"), from
    importing torchao with its notices kept (engine/core/quiet.py); [] without torchao."""
    from engine.core.quiet import extension_failures, quiet_libraries

    if not _has("torchao"):
        return []
    quiet_libraries()
    import torchao  # noqa: F401  (its import tries each extension)

    return extension_failures()


def with_extension_notes(verdicts: dict[str, gating.Verdict],
                         failures: list[str]) -> dict[str, gating.Verdict]:
    """A native MXFP8 verdict says so when torchao's compiled MXFP8 extension did not load
    (built for another Python or torch): a trial that needs its CUDA kernels fails there."""
    failed = next((f for f in failures if "_C_mxfp8" in f), None)
    if failed is None:
        return verdicts
    return {p: (gating.Verdict(v.support, f"{v.reason}; but torchao's compiled MXFP8 "
                               f"extension did not load ({failed}): a trial that needs its "
                               "CUDA kernels fails, and this is why")
                if v.support == "native" and recipe(p).mx == "mxfp8" else v)
            for p, v in verdicts.items()}


def probe(requested: str = "auto") -> DeviceInfo:
    """Inspect the device ``requested`` names. Raises ``ValueError`` for impossible asks."""
    dev = resolve_device(requested)
    fallback = None
    if requested.strip().lower() == "auto" and dev.type == "cpu" and torch.version.cuda:
        # a CUDA build that cannot use CUDA (driver too old, no GPU): say why
        fallback = f"--device auto chose the CPU: {cuda_unavailable_reason()}"
    if dev.type == "cpu":
        verdicts = gating.matrix(gating.CPU)
        # what this torch's CPU float8 GEMM lacks, where the hardware verdict allowed it
        unsupported = cpu_float8.unsupported_on_cpu() | _unsupported(verdicts)
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
            bf16_hardware=cpu_bf16_hardware(_cpuinfo()),
            tf32_supported=False,
            fp8_supported=False,
            unsupported=unsupported,
            fallback_reason=fallback,
            verdicts=verdicts,
        )
    index = dev.index or 0
    props = torch.cuda.get_device_properties(index)
    cc = (props.major, props.minor)
    name = props.name
    uuid, bus_id = _uuid_and_bus_id(props)
    described = gating.DeviceDescription.from_properties(props)
    verdicts = gating.matrix(described)
    if any(v.support == "native" and recipe(p).mx == "mxfp8" for p, v in verdicts.items()):
        verdicts = with_extension_notes(verdicts, torchao_extension_failures())
    unsupported = _unsupported(verdicts)
    rocm = described.kind == "rocm"
    if rocm:  # torch's ROCm build answers through torch.cuda; AMD SMI knows the GPU
        h, mig_handle = None, None
        handle_info = amd_smi.device_static(amd_smi.handle_for(bus_id))
    else:
        h = nvml.handle_for(uuid, bus_id)
        handle_info = nvml.device_static(h)
        mig_handle = nvml.query("nvmlDeviceIsMigDeviceHandle", h) if h is not None else None
    mig = "MIG" in name or bool(mig_handle)
    return DeviceInfo(
        kind="cuda",
        index=index,
        name=name,
        compute_capability=cc,
        total_memory_bytes=int(props.total_memory),
        cuda_version=torch.version.cuda,
        driver_version=handle_info.get("driver_version"),
        nvml_available=amd_smi.available() if rocm else nvml.available(),
        bf16_supported="bf16" not in unsupported,
        bf16_hardware="bf16" not in unsupported,
        tf32_supported="tf32" not in unsupported,
        fp8_supported=verdicts["fp8"].support == "native" and "fp8" not in unsupported,
        unsupported=unsupported,
        uuid=uuid,
        pci_bus_id=bus_id,
        sm_count=int(props.multi_processor_count),
        mig=mig,
        power_method=(ROCM_POWER_METHOD if rocm else nvml.power_method(cc)),
        verdicts=verdicts,
        gcn_arch=described.gcn_arch,
        hip_version=getattr(torch.version, "hip", None) if rocm else None,
    )


ROCM_POWER_METHOD = ("AMD SMI socket power in W: the current reading where the GPU fills it "
                     "(MI300), else the average")


def nvml_handle_of(index: int):
    """The NVML handle of torch's ``cuda:index`` (by UUID, never by NVML's own numbering)."""
    return nvml.handle_for(*_uuid_and_bus_id(torch.cuda.get_device_properties(index)))


def _uuid_and_bus_id(props) -> tuple[str | None, str | None]:
    """The GPU's UUID and PCI bus id (NVML's ``domain:bus:device.function`` form)."""
    uuid = getattr(props, "uuid", None)
    uuid = str(uuid) if uuid is not None else None
    try:
        bus_id = (f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:"
                  f"{props.pci_device_id:02X}.0")
    except (AttributeError, TypeError, ValueError):
        bus_id = None
    return uuid, bus_id
