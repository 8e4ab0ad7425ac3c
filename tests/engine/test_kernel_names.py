"""Kernel names from real traces and sources, with the class and Tensor Core verdict
AmpScope must give each. Every row says where its name came from: a recorded trace in a
public repository (repository and path), or the source that defines the kernel.

Names are facts copied from those files; nothing of the files themselves is kept here.
"""

import pytest

from engine.measure.kernel_names import MATMUL_KINDS, classify_kernel

HTA = "facebookresearch/HolisticTraceAnalysis"
HTA_A100_ALEXNET = (f"{HTA} tests/data/critical_path/alexnet/"
                    "benchmark_result_2869224_1695835535_trace.json.gz (A100)")
HTA_A100_NCCL = f"{HTA} tests/data/nccl_parser_config/nccl_data.json.gz (A100)"
HTA_A100_80GB = (f"{HTA} tests/data/negative_queue_length_values_check/rank0.json.gz "
                 "(A100-SXM4-80GB)")
HTA_V100 = f"{HTA} tests/data/trace_diff/test/test.json.gz (V100)"
HTA_TRITON = f"{HTA} tests/data/triton_example/triton_example.json.gz (A100, torch.compile)"
NSYS_AI = "GindaChen/nsys-ai"
NSYS_H100_FP32 = f"{NSYS_AI} tests/fixtures/h100_2gpu_1s.sqlite (H100, fp32 GPT-2)"
NSYS_H100_BF16 = f"{NSYS_AI} tests/fixtures/mfu_2gpu_after.sqlite (H100, bf16)"
NSYS_TE_ADAM = f"{NSYS_AI} tests/trajectories/B_iteration/q036.json"
PT_MEM_EFF = ("pytorch/pytorch aten/src/ATen/native/transformers/cuda/mem_eff_attention/"
              "kernels/cutlassF.h")
FA2_BWD = "Dao-AILab/flash-attention csrc/flash_attn/src/flash_bwd_launch_template.h"
FA2_FWD = "Dao-AILab/flash-attention csrc/flash_attn/src/flash_fwd_launch_template.h"
FA3_FWD = "Dao-AILab/flash-attention hopper/flash_fwd_launch_template.h (abridged template)"
BNB = "bitsandbytes-foundation/bitsandbytes csrc/kernels.cu (launched from csrc/ops.cu)"
INDUCTOR = ("pytorch/pytorch torch/_inductor/codegen/triton.py: triton_<category[:3]>_<fused "
            "ops>_<n>, category from torch/_inductor/wrapper_benchmark.py")
NCCL = "NVIDIA/nccl src/device/generate.py (ncclDevKernel_<coll>_<op>_<type>_<algo>_<proto>)"
CUTLASS_DOC = "NVIDIA/cutlass media/docs/cpp/profiler.md (its CUTLASS 3 kernel-name example)"
FA2_FP16 = ("the bf16 name above with the element type Dao-AILab/flash-attention "
            "csrc/flash_attn/src/static_switch.h (FP16_SWITCH) picks for fp16")

# (name, kind, Tensor Core verdict, source)
ROWS = [
    # H100 (sm90): cuBLAS nvjet GEMMs and fp32 FFMA GEMMs, FlashAttention 2 in bf16, NCCL
    ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN", "matmul", True, NSYS_H100_BF16),
    ("nvjet_tst_96x64_64x10_1x2_h_bz_bias_TNN", "matmul", True, NSYS_H100_BF16),
    ("nvjet_tst_128x320_64x3_2x1_v_bz_coopB_NNN", "matmul", True,
     f"{NSYS_AI} tests/test_kernel_classifier.py"),
    ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<(int)128, (int)128, (int)64, "
     "(int)4, (bool)0, (bool)0, cutlass::bfloat16_t, Flash_kernel_traits<(int)128, (int)128, "
     "(int)64, (int)4, cutlass::bfloat16_t>>, (bool)0, (bool)0, (bool)0, (bool)0, (bool)0, "
     "(bool)1, (bool)0, (bool)0>(flash::Flash_fwd_params)", "attention", True, NSYS_H100_BF16),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x256x8_stage3_warpsize1x4x1_ffma_"
     "aligna4_alignc4_execute_kernel__5x_cublas", "matmul", False, NSYS_H100_FP32),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x256x8_stage3_warpsize1x4x1_ffma_"
     "aligna4_alignc4_execute_split_k_kernel__5x_cublas", "matmul", False, NSYS_H100_FP32),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<(unsigned long)4096>)", "communication",
     None, NSYS_H100_BF16),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "communication", None,
     f"{NSYS_AI} tests/test_kernel_classifier.py"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "communication", None, NCCL),
    ("void at::native::<unnamed>::vectorized_layer_norm_kernel<float, float, (bool)0>(int, T2, "
     "const T1 *, const T1 *, const T1 *, T2 *, T2 *, T1 *)", "reduction/normalisation", None,
     NSYS_H100_BF16),
    ("void multi_tensor_apply_kernel<TensorListMetadata<(int)4, (bool)0>, transformer_engine::"
     "multi_tensor_adam::AdamFunctor<float, float, float, int>, float, float, float, float, "
     "float, float, transformer_engine::multi_tensor_adam::adamMode_t, float>(long, volatile "
     "int *, T1, T2, T3...)", "foreach/optimizer", None, NSYS_TE_ADAM),
    ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<(int)128, (int)128, (int)64, "
     "(int)4, (bool)0, (bool)0, cutlass::half_t, Flash_kernel_traits<(int)128, (int)128, "
     "(int)64, (int)4, cutlass::half_t>>, (bool)0, (bool)0, (bool)0, (bool)0, (bool)0, "
     "(bool)1, (bool)0, (bool)0>(flash::Flash_fwd_params)", "attention", True, FA2_FP16),
    # CUTLASS 3 Hopper GEMMs (torch.compile's CUTLASS backend, the CUTLASS profiler)
    ("cutlass3x_sm90_tensorop_gemm_f16_f16_f32_f16_f32_128x128x64_2x1x1_0_ntn_align8",
     "matmul", True, CUTLASS_DOC),
    # FlashAttention 3 (Hopper): the main kernel is a CUTLASS device_kernel
    ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::"
     "CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1>>, "
     "cutlass::bfloat16_t, float, cutlass::arch::Sm90>>>>", "attention", True, FA3_FWD),
    # FlashAttention 2 helpers: no MMA
    ("flash_fwd_splitkv_combine_kernel", "matmul helper", None, FA2_FWD),
    ("flash_bwd_dot_do_o_kernel", "matmul helper", None, FA2_BWD),
    ("flash_bwd_convert_dq_kernel", "matmul helper", None, FA2_BWD),
    ("flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", "attention", True, FA2_BWD),
    # PyTorch's memory-efficient attention (xformers' CUTLASS kernels)
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "attention", True, PT_MEM_EFF),
    ("fmha_cutlassF_f16_aligned_64x64_rf_sm80", "attention", True, PT_MEM_EFF),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80", "attention", True, PT_MEM_EFF),  # 3xTF32
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm75", "attention", False, PT_MEM_EFF),  # SIMT
    ("fmha_cutlassF_f16_aligned_64x64_rf_sm75", "attention", True, PT_MEM_EFF),
    ("fmha_cutlassF_f16_aligned_64x64_rf_sm50", "attention", False, PT_MEM_EFF),  # SIMT
    # A100 (sm80)
    ("ampere_sgemm_32x32_sliced1x4_tn", "matmul", False, HTA_A100_ALEXNET),
    ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16"
     "_stage4_warpsize2x2x1_g1_tensor16x8x8_alignc4_execute_kernel_cudnn", "matmul", True,
     HTA_A100_ALEXNET),
    ("cudnn_ampere_scudnn_128x64_relu_xregs_large_nn_v1", "matmul", False, HTA_A100_ALEXNET),
    ("void epilogue::impl::globalKernel<float, float, float, true, true>(int, int, long, float*,"
     " cublasLtEpilogue_t, int, float*, long, void*, long, long, long, float*, long, int*)",
     "matmul helper", None, HTA_A100_ALEXNET),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(cutlass_80_"
     "tensorop_s1688gemm_256x64_16x4_nn_align4::Params)", "matmul", True, HTA_A100_NCCL),
    ("void cutlass_cudnn_train::Kernel<cutlass_cudnn_train::reduction::kernel::ReduceSplitK<"
     "cutlass_cudnn_train::MatrixShape<4, 128>, cutlass_cudnn_train::epilogue::thread::"
     "LinearCombination<float, 4, float, float, (cutlass_cudnn_train::epilogue::thread::"
     "ScaleType::Kind)0, (cutlass_cudnn_train::FloatRoundStyle)2>, cutlass_cudnn_train::"
     "reduction::thread::ReduceAdd<float, float, 4>, 4> >", "matmul helper", None,
     HTA_A100_NCCL),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
     "communication", None, HTA_A100_NCCL),
    ("void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>, float, float, "
     "float, float, float, float, float, float, adamMode_t, float, int, int, int>(int, int "
     "volatile*, TensorListMetadata<4>, AdamFunctor<float>, float, float, float, float, float, "
     "float, float, float, adamMode_t, float, int, int, int)", "foreach/optimizer", None,
     HTA_A100_80GB),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<"
     "float, float, float, float>, unsigned int, float, 4> >(at::native::ReduceOp<float, "
     "at::native::MeanOps<float, float, float, float>, unsigned int, float, 4>)",
     "reduction/normalisation", None, HTA_A100_80GB),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
     "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, "
     "at::detail::Array<char*, 3>)", "elementwise", None, HTA_A100_80GB),
    # V100 (sm70): cuBLAS split-K reduction and SIMT sgemm
    ("void splitKreduce_kernel<float, float, float, float, true, false, false>("
     "cublasSplitKParams<float>, float const*, float const*, float*, float const*, float const*,"
     " float const*, float const*, float*, void*, long, float*, int*)", "matmul helper", None,
     HTA_V100),
    ("volta_sgemm_32x32_sliced1x4_tn", "matmul", False, HTA_V100),
    # bitsandbytes int8 (LLM.int8()): quantise / dequantise around the int8 GEMM
    ("void kInt8VectorQuant<__half, 1024, 1>(__half*, signed char*, float*, float, int, int)",
     "quantisation", None, BNB),
    ("void kdequant_mm_int32_fp16<4, 512>(int*, float*, float*, __half*, __half*, int, int, int)",
     "quantisation", None, BNB),
    # torch.compile (inductor) Triton kernels
    ("triton_poi_fused_add_cos_sin_0", "elementwise", None, HTA_TRITON),
    ("triton_red_fused_native_layer_norm_0", "reduction/normalisation", None, INDUCTOR),
    ("triton_per_fused_native_layer_norm_1", "reduction/normalisation", None, INDUCTOR),
    ("triton_tem_fused_mm_0", "matmul", None, INDUCTOR),  # the name does not carry the dtype
]


@pytest.mark.parametrize(("name", "kind", "tensor_core", "source"), ROWS,
                         ids=[r[0][:60] for r in ROWS])
def test_real_kernel_name(name, kind, tensor_core, source):
    kc = classify_kernel(name)
    assert (kc.kind, kc.tensor_core) == (kind, tensor_core), (source, kc.why)
    assert source  # every row names where its kernel name came from


def test_matmul_helpers_never_count_in_the_tensor_core_share():
    # a helper is not a matmul kind, so the Tensor Core share's denominator leaves it out
    helpers = [r for r in ROWS if r[1] == "matmul helper"]
    assert helpers and not any(classify_kernel(r[0]).kind in MATMUL_KINDS for r in helpers)


def test_fp32_memory_efficient_attention_says_which_path():
    assert "3xTF32" in classify_kernel("fmha_cutlassF_f32_aligned_64x64_rf_sm80").why
    assert "SIMT" in classify_kernel("fmha_cutlassF_f32_aligned_64x64_rf_sm75").why
