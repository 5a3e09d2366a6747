"""The kernel classifier of ``bench/decode_step.py --profile`` (issue 39) on a recorded list of
kernel names (torch 2.11 / CUDA 12 on Hopper: cuBLAS, FlashMLA, SPLASH's Triton kernels, ATen),
and the per-class breakdown with its idle gap; a breakdown of nothing, of a non-finite time or
of a step shorter than its kernels is refused (each check can fail)."""

from __future__ import annotations

import pytest

from splash_bench.kernel_classes import NAMES, Kernel, breakdown, classes_of, kernel_class, with_costs

RECORDED = {
    "nvjet_tst_128x64_64x8_2x1_v_bz_TNT": "gemm",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_"
    "cublas": "gemm",
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>(cutlass_80_wmma_"
    "tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8::Params)": "gemm",
    "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true, false, false>"
    "(cublasLt::cublasSplitKParams<float>, float const*, __nv_bfloat16 const*, __nv_bfloat16*)": "gemm",
    "_fp8_block_gemm_kernel": "gemm",
    "void flash_fwd_splitkv_mla_kernel<Flash_fwd_kernel_traits_mla<576, 64, 64, 8, cutlass::bfloat16_t, 512>, true, "
    "SharedStorageMLA<Flash_fwd_kernel_traits_mla<576, 64, 64, 8, cutlass::bfloat16_t, 512> > >"
    "(Flash_fwd_mla_params)": "attention",
    "void flash_fwd_splitkv_mla_combine_kernel<cutlass::bfloat16_t, float, 512, 64>(Flash_fwd_mla_params)": "attention",
    "_attention_kernel": "attention",
    "_merge_kernel": "attention",
    "_sparse_kernel": "attention",
    "_add_rms_norm_kernel": "elementwise",
    "_latent_kernel": "elementwise",
    "_silu_mul_kernel": "elementwise",
    "_token_groups_kernel": "elementwise",
    "triton_poi_fused_add_mul_0": "elementwise",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
    "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)": "elementwise",
    "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>"
    "(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>)": "elementwise",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, "
    "long, 4> >(at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, 4>)": "elementwise",
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<2u>, "
    "unsigned int, 2, 128, 1>(...)": "elementwise",
    "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(at::cuda::detail::TensorInfo<float, unsigned "
    "int>, unsigned int, unsigned int, bool, unsigned int, unsigned int)": "routing_topk",
    "void at::native::bitonicSortKVInPlace<2, -1, 16, 16, float, long, at::native::GTOp<float, true>, unsigned int>"
    "(...)": "routing_topk",
    "void cub::CUB_200700_900_NS::DeviceRadixSortOnesweepKernel<cub::CUB_200700_900_NS::DeviceRadixSortPolicy<long, "
    "long, unsigned int>::Policy900, false, long, long, unsigned int, int, int>(...)": "routing_topk",
    "void cub::CUB_200700_900_NS::DeviceScanKernel<...>(...)": "routing_topk",
    "Memcpy DtoD (Device -> Device)": "memcpy",
    "Memset (Device)": "memcpy",
    "_copy_pages": "memcpy",
    "aten::mm": "gemm",
    "aten::addmm": "gemm",
    "aten::topk": "routing_topk",
    "aten::copy_": "elementwise",
    "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "collective",
    "at::cuda::(anonymous namespace)::spin_kernel(long)": "other",
}


def test_recorded_kernel_names_fall_in_their_classes():
    wrong = {name[:60]: (kernel_class(name), want) for name, want in RECORDED.items() if kernel_class(name) != want}
    assert not wrong
    assert set(RECORDED.values()) <= set(NAMES)


def _step() -> list[Kernel]:
    """A decode step: norm, projection GEMMs, attention, MLP, final norm, LM head GEMM, argmax."""
    names = ["_add_rms_norm_kernel", "nvjet_a", "_attention_kernel", "nvjet_b", "_silu_mul_kernel", "nvjet_c",
             "_add_rms_norm_kernel", "nvjet_head", "reduce_kernel ArgMaxOps", "Memcpy DtoD (Device -> Device)"]
    out, t = [], 0.0
    for i, name in enumerate(names):
        out.append(Kernel(name, t, 10.0 * (i + 1)))
        t += 10.0 * (i + 1) + 2.0  # a 2 us gap after every kernel
    return out


def test_breakdown_shares_the_step_and_names_its_idle_gap():
    kernels = _step()
    classes = classes_of(kernels)
    assert classes[7] == "lm_head" and classes.count("gemm") == 3  # the last GEMM is the LM head's
    split_k = kernels[:8] + [Kernel("void cublasLt::splitKreduce_kernel<32, 16>", 400.0, 3.0)] + kernels[8:]
    assert classes_of(split_k)[6:9] == ["elementwise", "lm_head", "lm_head"]  # the head's GEMM and its reduction
    split = breakdown(kernels)
    busy = sum(10.0 * (i + 1) for i in range(10))
    assert split["busy_us"] == pytest.approx(busy) and split["span_us"] == pytest.approx(busy + 2.0 * 9)
    assert split["idle_gap_us"] == pytest.approx(18.0)
    c = split["classes"]
    assert c["gemm"]["us"] == pytest.approx(20 + 40 + 60) and c["lm_head"]["us"] == pytest.approx(80)
    assert c["attention"]["us"] == pytest.approx(30) and c["memcpy"]["kernels"] == 1
    assert sum(v["share"] for v in c.values()) + split["idle_share"] == pytest.approx(1.0)
    assert breakdown(kernels, step_us=1000.0)["idle_gap_us"] == pytest.approx(1000.0 - busy)
    costed = with_costs(split, {"lm_head": {"bytes": 4e6, "flops": 0}}, {"copy_gbps": 100.0, "matmul_tflops": 1.0})
    assert costed["classes"]["lm_head"]["floor_us"] == pytest.approx(40.0)  # 4 MB at 100 GB/s
    assert costed["classes"]["lm_head"]["over_floor"] == pytest.approx(2.0)
    assert "floor_us" not in split["classes"]["lm_head"]  # the split it was given is left as it was
    # FLOPs through FP8-kept weights count at the FP8 rate where one was measured, else at the matmul rate
    gemm = {"gemm": {"flops": 60e6, "fp8_flops": 120e6}}
    rates = {"copy_gbps": 100.0, "matmul_tflops": 1.0}
    assert with_costs(split, gemm, rates)["classes"]["gemm"]["floor_us"] == pytest.approx(180.0)
    fp8 = with_costs(split, gemm, {**rates, "fp8_matmul_tflops": 2.0})["classes"]["gemm"]
    assert fp8["floor_us"] == pytest.approx(60.0 + 60.0) and fp8["over_floor"] == pytest.approx(1.0)
    # in series: each class at its own floor, summed (a compute-bound class is not hidden by the others' bytes)
    both = with_costs(split, {**gemm, "lm_head": {"bytes": 4e6}}, rates)
    assert both["serial_floor_us"] == pytest.approx(180.0 + 40.0)
    assert both["over_serial_floor"] == pytest.approx(split["step_us"] / 220.0)


def test_overlapping_kernels_count_once_and_bad_input_is_refused():
    overlapping = [Kernel("nvjet", 0.0, 10.0), Kernel("Memcpy DtoD", 5.0, 10.0)]
    assert breakdown(overlapping)["busy_us"] == pytest.approx(15.0)
    with pytest.raises(ValueError, match="no kernels"):
        breakdown([])
    with pytest.raises(ValueError, match="is not a time"):
        breakdown([Kernel("nvjet", 0.0, float("nan"))])
    with pytest.raises(ValueError, match="is not a time"):
        breakdown([Kernel("nvjet", float("inf"), 1.0)])
    with pytest.raises(ValueError, match="not a positive time covering"):
        breakdown(overlapping, step_us=12.0)  # shorter than the 15 us kernels ran
    with pytest.raises(ValueError, match="not a positive time covering"):
        breakdown(overlapping, step_us=float("nan"))


def test_the_result_shape_refuses_a_split_that_is_not_one():
    from splash_bench.shapes.decode_step import _profile_error

    split = breakdown(_step())
    assert _profile_error(split) is None
    assert "no classes" in _profile_error({**split, "classes": {}})
    nan = {**split, "classes": {**split["classes"], "gemm": {**split["classes"]["gemm"], "share": float("nan")}}}
    assert "not finite" in _profile_error(nan)
    assert "do not make up" in _profile_error({**split, "idle_gap_us": split["idle_gap_us"] + 5.0})
    assert "do not make up" in _profile_error({**split, "busy_us": 0.0, "idle_gap_us": split["step_us"]})
    assert _profile_error({"error": "ValueError: no kernels"}) is None  # recorded why, the timings stand
    assert _profile_error({"error": " "}) == "an empty error"
