"""Which recipes a device runs natively, runs emulated, or cannot run, and why.

The verdict depends only on what the device is (an NVIDIA compute capability, an AMD
``gfx`` architecture, or the CPU), so it is decided from the fields
``torch.cuda.get_device_properties`` returns and tested with the values real GPUs
report. Installation problems (bitsandbytes or torchao missing) are the probe's
business (``engine.measure.device``), not the hardware's.

*Emulated* means the trial runs and its memory and numerics are real, but the
arithmetic is not done by the format's own hardware, so its speed is not
representative and is left out of rankings.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.config import PRECISIONS
from engine.core.recipes import recipe

SUPPORT: tuple[str, ...] = ("native", "emulated", "unsupported")

_FP8_MIN_CC = (8, 9)  # Ada: the first NVIDIA Tensor Cores with fp8 (torch._scaled_mm)
_MX_NATIVE_MAJOR = 10  # B200/GB200/B300: tcgen05 block-scaled fp8/fp4 GEMMs (sm_100)
_BF16_MIN_CC = (8, 0)  # Ampere: bf16 and TF32 Tensor Cores
# AMD Instinct archs AmpScope knows, with the fp8 flavour their matrix cores take
# (torchao's Float8TypeConfig picks e4m3fnuz on MI300, the OCP e4m3fn on MI350)
_ROCM_FP8 = {
    "gfx942": "e4m3fnuz/e5m2fnuz (FNUZ: no negative zero, one NaN, exponent bias 8)",
    "gfx950": "OCP e4m3fn/e5m2 (the same formats as NVIDIA)",
}
_ROCM_NAMES = {"gfx942": "CDNA 3 (MI300X/MI325X)", "gfx950": "CDNA 4 (MI350X/MI355X)"}


@dataclass(frozen=True)
class DeviceDescription:
    """What a device is, as far as precision support goes."""

    kind: str  # "cpu", "cuda" (NVIDIA) or "rocm" (AMD, through torch.cuda)
    name: str
    compute_capability: tuple[int, int] | None = None  # NVIDIA only
    gcn_arch: str | None = None  # AMD only, without feature flags: "gfx942"

    def __post_init__(self):
        if self.kind not in ("cpu", "cuda", "rocm"):
            raise ValueError(f"device kind '{self.kind}' is not cpu, cuda or rocm")

    @classmethod
    def from_properties(cls, props) -> DeviceDescription:
        """From ``torch.cuda.get_device_properties``: ROCm builds name a ``gfx`` arch in
        ``gcnArchName`` (e.g. ``gfx942:sramecc+:xnack-``); CUDA builds do not."""
        arch = str(getattr(props, "gcnArchName", "") or "")
        if arch.startswith("gfx"):
            return cls("rocm", props.name, gcn_arch=arch.split(":", 1)[0])
        return cls("cuda", props.name, compute_capability=(props.major, props.minor))

    def describe(self) -> str:
        if self.kind == "cpu":
            return "the CPU"
        if self.kind == "rocm":
            return f"{self.name} ({self.gcn_arch})"
        cc = self.compute_capability or (0, 0)
        return f"{self.name} (compute capability {cc[0]}.{cc[1]})"


CPU = DeviceDescription("cpu", "cpu")


@dataclass(frozen=True)
class Verdict:
    support: str  # one of SUPPORT
    reason: str

    def __post_init__(self):
        if self.support not in SUPPORT:
            raise ValueError(f"support '{self.support}' is not one of {', '.join(SUPPORT)}")


# torchao 0.18's NVFP4 training runs Triton kernels and fp4 GEMMs (torch._scaled_mm on
# float4_e2m1fn_x2) that only compute capability 10.x has; elsewhere AmpScope's own emulation
# (engine/measure/nvfp4_linear.py) runs Transformer Engine's reference recipe
_NVFP4_EMULATED = ("AmpScope emulates NVFP4 training (Transformer Engine's reference recipe: "
                   "e2m1 in 1x16 blocks with e4m3 scales and an fp32 tensor scale, 16x16 "
                   "weight blocks, a random Hadamard transform on the weight-gradient GEMM's "
                   "inputs, stochastic rounding of gradients): each GEMM's operands are "
                   "quantised and dequantised as the native recipe does and multiplied in "
                   "fp32, so loss, gradients and SQNR are NVFP4's but the speed is not "
                   "representative (emulated GEMMs run in higher precision)")


def _mx(precision: str, dev: DeviceDescription) -> Verdict:
    """MXFP8: native on 10.x, torchao's emulated kernel preference anywhere else; NVFP4:
    native on 10.x, AmpScope's emulation anywhere else."""
    rec = recipe(precision)
    where = dev.describe()
    native = dev.kind == "cuda" and (dev.compute_capability or (0, 0))[0] == _MX_NATIVE_MAJOR
    if rec.mx == "nvfp4":
        if native:
            return Verdict("native", f"{where} has block-scaled fp4 Tensor Cores; torchao "
                           "runs NVFP4 GEMMs on them (its NVFP4 training is a prototype)")
        why = ("the CPU has no FP4 matrix unit" if dev.kind == "cpu" else
               f"{where} has no FP4 Tensor Cores torchao can use (its NVFP4 kernels are built "
               "for compute capability 10.x only)")
        return Verdict("emulated", f"{why}: {_NVFP4_EMULATED}")
    if native:
        return Verdict("native", f"{where} has block-scaled fp8 Tensor Cores; torch._scaled_mm "
                       "runs MXFP8 GEMMs with e8m0 block scales on them")
    # consumer Blackwell (12.0) and gfx950 have MX instructions, but torchao's MXFP8 GEMMs
    # and casts are built for sm_100 only
    why = ("the CPU has no block-scaled (MX) matrix unit" if dev.kind == "cpu" else
           f"torchao 0.18's MXFP8 kernels are built for compute capability 10.x only, not "
           f"for {where}")
    return Verdict("emulated", f"{why}: torchao's emulated kernel preference quantises each "
                   "operand to MXFP8 and multiplies the dequantised values, so memory and "
                   "numerics are real but the speed is not representative")


def _cpu(precision: str) -> Verdict:
    rec = recipe(precision)
    if rec.mx:
        return _mx(precision, CPU)
    if rec.tf32:
        return Verdict("unsupported", "TF32 is a Tensor Core matmul mode of NVIDIA Ampere and "
                       "newer GPUs; on the CPU it would be plain fp32: run on a CUDA GPU")
    if rec.fp8:
        return Verdict("emulated", "the CPU has no fp8 matrix unit: torch's CPU _scaled_mm "
                       "does the float8 GEMMs in software, so memory and numerics are real "
                       "but the speed is not representative")
    if rec.quant:
        return Verdict("native", "runs on bitsandbytes' CPU backend")
    return Verdict("native", "runs on torch's CPU kernels")


def _cuda(precision: str, dev: DeviceDescription) -> Verdict:
    rec = recipe(precision)
    cc = dev.compute_capability or (0, 0)
    where = dev.describe()
    if rec.mx:
        return _mx(precision, dev)
    if rec.fp8:
        if cc >= _FP8_MIN_CC:
            # rowwise scales go to cuBLASLt as outer-vector scaling (CUDA 12.9+, torch's
            # Blas.cpp), so every fp8-capable compute capability takes both granularities
            granularity = "rowwise" if "rowwise" in precision else "tensorwise"
            return Verdict("native", f"{where} has fp8 Tensor Cores; torch._scaled_mm runs "
                           f"{granularity}-scaled float8 GEMMs on them")
        return Verdict("unsupported", f"fp8 training needs compute capability 8.9+ (Ada, "
                       f"Hopper, Blackwell); {where} has no fp8 Tensor Cores: choose bf16-amp "
                       "or fp16-amp")
    needs_bf16 = rec.tf32 or torch.bfloat16 in (rec.weight_dtype, rec.autocast_dtype)
    if needs_bf16 and cc < _BF16_MIN_CC:
        what = "TF32 mode" if rec.tf32 else "bf16 Tensor Cores"
        return Verdict("unsupported", f"{where} has no {what}: needs Ampere (8.0+)")
    return Verdict("native", f"{where} runs {precision} on its own hardware")


def _rocm(precision: str, dev: DeviceDescription) -> Verdict:
    rec = recipe(precision)
    arch = dev.gcn_arch or ""
    where = dev.describe()
    if arch not in _ROCM_FP8:
        if rec.mx:
            return _mx(precision, dev)
        if rec.fp8 or rec.tf32:
            return Verdict("unsupported", f"{where} is not an AMD arch AmpScope knows fp8/TF32 "
                           f"support for (known: {', '.join(_ROCM_FP8)})")
        return Verdict("native", f"{where} runs {precision} through ROCm")
    family = _ROCM_NAMES[arch]
    if rec.mx:
        return _mx(precision, dev)
    if rec.fp8:
        # hipBLASLt's rowwise scaled_mm wants a bf16 output, which bf16 autocast gives
        return Verdict("native", f"{where}, {family}: fp8 matrix cores in "
                       f"{_ROCM_FP8[arch]}; torchao picks that flavour")
    if rec.tf32:
        # torch.cuda.is_tf32_supported accepts gfx94x and gfx95x on ROCm
        return Verdict("native", f"{where}, {family}: TF32 (XF32) through hipBLASLt")
    if rec.quant:  # bitsandbytes ships ROCm builds (libbitsandbytes_rocm*)
        return Verdict("native", f"{where}, {family}: bitsandbytes' ROCm build")
    return Verdict("native", f"{where}, {family} runs {precision} through ROCm")


def verdict(precision: str, dev: DeviceDescription) -> Verdict:
    """Native, emulated or unsupported, with the reason, for one recipe on ``dev``."""
    if dev.kind == "cpu":
        return _cpu(precision)
    if dev.kind == "rocm":
        return _rocm(precision, dev)
    return _cuda(precision, dev)


def matrix(dev: DeviceDescription) -> dict[str, Verdict]:
    """Every recipe's verdict on ``dev``, in the order of the precision list."""
    return {p: verdict(p, dev) for p in PRECISIONS}
