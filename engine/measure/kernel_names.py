"""What a GPU kernel's name says: its kind (matmul, attention, a helper beside a matmul,
communication, quantisation, elementwise...) and, for a matmul, whether it ran on Tensor
Cores and why. A trace gives nothing else about a kernel, so the rules are the names'
families as the libraries that launch them spell them (cuBLAS, CUTLASS, FlashAttention,
inductor's Triton, NCCL, bitsandbytes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# What a kernel's name says (a name is the only evidence a trace has). Tensor Core
# families: MMA instructions (HMMA/IMMA, Hopper's wgmma, Blackwell's tcgen05), cuBLAS's
# Hopper GEMM family nvjet (warpgroup MMA), tile names such as s16816/s1688, or a GEMM/
# xmma/cutlass kernel whose name carries a half, bfloat16, 8-bit or TF32 input type
# ("xmma_gemm_f32f32_f32f32" is plain fp32). SIMT templates, sgemm/dgemm and gemv do not.
_TENSOR_CORE = re.compile(
    r"wgmma|hmma|imma|tcgen05|nvjet|tensorop|s16816|s1688|h16816|h1688|i16832|i8816|"
    r"(gemm|xmma|cutlass).*(f16|bf16|fp16|half|bfloat16|e4m3|e5m2|tf32|i8)|"
    r"(f16|bf16|fp16|half|bfloat16|e4m3|e5m2|tf32).*(gemm|cutlass)", re.IGNORECASE)
_NOT_TENSOR_CORE = re.compile(r"simt|gemv|dot_kernel|sgemm(?!.*tf32)|dgemm|scudnn|ffma|"
                              r"gemm_4bit_inference|_f32f32_f32f32", re.IGNORECASE)
_COMMUNICATION = re.compile(r"nccl", re.IGNORECASE)
# Kernels that run beside a matmul but do no multiply-accumulate: cuBLASLt's split-K
# reduction and epilogue, CUTLASS/cuDNN ReduceSplitK, FlashAttention's split-KV combine
# and backward pre/post-processing (FlashAttention 2: flash_bwd_{dot_do_o,convert_dq,
# clear_dkvaccum}_kernel; FlashAttention 3: FlashAttnBwdPreprocess/Postprocess,
# FlashAttnFwdCombine), cuDNN's offset helpers.
_MATMUL_HELPER = re.compile(
    r"splitKreduce|ReduceSplitK|splitkv_combine|FwdCombine|flash_bwd_(dot_do_o|convert|clear)|"
    r"BwdPreprocess|BwdPostprocess|prepare_varlen|epilogue::impl|compute\w*OffsetsKernel",
    re.IGNORECASE)
_TRITON = re.compile(r"\btriton_(poi|red|per|tem)_")
_ATTENTION = re.compile(r"flash_fwd|flash_bwd|FlashAttn|fmha_cutlass|fmha_|AttentionKernel|"
                        r"AttentionBackwardKernel", re.IGNORECASE)
_GEMM = re.compile(r"gemm|gemv|xmma|wgmma|nvjet|cutlass|dot_kernel|scudnn", re.IGNORECASE)
_QUANT = re.compile(r"quant", re.IGNORECASE)
_MEM_EFF = re.compile(r"fmha_cutlass[FB]_(f32|f16|bf16)\w*?_sm(\d+)")
_OTHER_KINDS = (
    (re.compile(r"multi_tensor_apply|fused_adam|FusedAdam|AdamFunctor", re.IGNORECASE),
     "foreach/optimizer"),
    (re.compile(r"reduce_kernel|norm|softmax", re.IGNORECASE), "reduction/normalisation"),
    (re.compile(r"elementwise", re.IGNORECASE), "elementwise"),
    (re.compile(r"memcpy|memset|copy", re.IGNORECASE), "copy"),
)
MATMUL_KINDS = ("matmul", "attention")


@dataclass(frozen=True)
class KernelClass:
    """What one kernel name says: its kind, and for matmul kinds whether it ran on
    Tensor Cores (None: not a matmul kind, or the name cannot tell) and why."""

    kind: str  # matmul, attention, matmul helper, communication, quantisation, ...
    tensor_core: bool | None
    why: str


def classify_kernel(name: str) -> KernelClass:
    """The kind and Tensor Core verdict of a kernel, from its name alone."""
    if _COMMUNICATION.search(name):
        return KernelClass("communication", None, "NCCL collective")
    if _MATMUL_HELPER.search(name):
        return KernelClass("matmul helper", None, "reduction/epilogue beside a matmul, no MMA")
    triton = _TRITON.search(name)
    if triton:
        kind = {"poi": "elementwise", "red": "reduction/normalisation",
                "per": "reduction/normalisation", "tem": "matmul"}[triton.group(1)]
        if kind != "matmul":
            return KernelClass(kind, None, f"Triton {kind} kernel (inductor)")
        # inductor names templates triton_tem_<fused ops>; tl.dot uses Tensor Cores only
        # for half/8-bit/TF32 inputs, which the name does not carry
        return KernelClass("matmul", None, "Triton template: the name does not say the "
                                           "input dtype, so not whether tl.dot used MMA")
    if _QUANT.search(name) and not _GEMM.search(name):
        return KernelClass("quantisation", None, "(de)quantisation, no MMA")
    if _ATTENTION.search(name):
        mem_eff = _MEM_EFF.search(name)
        if mem_eff:
            # PyTorch's memory-efficient attention (from xformers) picks its MMA by input
            # type and arch: fp32 on sm80+ is TF32 in 3 passes (OpMultiplyAddFastF32),
            # half types use Tensor Cores from Volta on, anything else is SIMT FMA
            # (pytorch/pytorch aten/src/ATen/native/transformers/cuda/mem_eff_attention/
            # gemm_kernel_utils.h, DefaultGemmType)
            dtype, sm = mem_eff.group(1), int(mem_eff.group(2))
            if dtype == "f32" and sm >= 80:
                return KernelClass("attention", True, "fp32 memory-efficient attention on "
                                                      "sm80+: 3xTF32 on Tensor Cores")
            if dtype != "f32" and sm >= 70:
                return KernelClass("attention", True, "half-precision memory-efficient "
                                                      "attention on Tensor Cores")
            return KernelClass("attention", False, f"{dtype} memory-efficient attention "
                                                   f"built for sm{sm}: SIMT, no Tensor Cores")
        if _NOT_TENSOR_CORE.search(name):
            return KernelClass("attention", False, "SIMT attention kernel")
        # FlashAttention takes fp16/bf16 (fp8 in version 3) and multiplies with MMA only
        return KernelClass("attention", True, "half-precision attention on Tensor Cores")
    if _GEMM.search(name):
        if _NOT_TENSOR_CORE.search(name):
            return KernelClass("matmul", False, "SIMT/gemv or plain fp32 GEMM")
        if re.search(r"nvjet_\w*?sss", name):
            return KernelClass("matmul", None, "fp32 nvjet: the name does not say whether "
                                               "TF32 was allowed")
        if _TENSOR_CORE.search(name):
            return KernelClass("matmul", True, "MMA family or half/8-bit/TF32 inputs")
        return KernelClass("matmul", None, "the name carries no input type or MMA family")
    for pattern, kind in _OTHER_KINDS:
        if pattern.search(name):
            return KernelClass(kind, None, kind)
    return KernelClass("other", None, "other")


def tensor_core_kernel(name: str) -> bool:
    """True when a kernel's name says it is a matmul that ran on Tensor Cores."""
    return classify_kernel(name).tensor_core is True
