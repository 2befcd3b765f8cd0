// The matrix-multiply kernel tables, one per ISA level, composed from each level's kernel objects. This file is
// compiled for no particular ISA: building the tables runs on every CPU, so it must not live in a file compiled
// for a level the CPU may lack.
#include "fp8kit/common/cpu.hpp"
#include "mm_kernels.hpp"

namespace fp8kit::mm_detail {

const MmKernelTable& scalar_mm_kernels() {
  static const MmKernelTable table{"scalar",     Isa::kScalar, &kScalarGemm,      nullptr,
                                   &kScalarGemv, nullptr,      &finish_row_scalar};
  return table;
}

// FP8 and bfloat16 left operands take the GEMV path up to kWideGemvMaxM here too: the packed GEMM decodes every
// weight into a float panel, which costs more than the FMAs at small M. AMD EPYC Zen 3 (AVX2 only), N = K = 4096,
// e4m3fn, 1 / 2 threads: M = 8 on the GEMV path 46 / 81 GFLOP/s (sgemm 21 / 24), M = 16 48 / 84 (sgemm 33 / 59;
// the GEMM gave 18 / 42). Float32 activations keep kGemvMaxM (fp8_weight_mm's bit-identical GEMM from M = 5).
const MmKernelTable& avx2_mm_kernels() {
  static const MmKernelTable table{"avx2",     Isa::kAvx2, &kAvx2Gemm,       nullptr,
                                   &kAvx2Gemv, &kAvx2Gemv, &finish_row_avx2, kWideGemvMaxM};
  return table;
}

namespace {
// The float32 GEMV of the AVX-512 levels: the table decode where the CPU has VBMI (AMD EPYC Zen 5, one thread, from
// DRAM: see docs/gemm.md), else the shift decode.
const GemvKernel& avx512_gemv_f32() {
  return cpu_features().avx512vbmi ? kAvx512VbmiGemv : kAvx512Gemv;
}
}  // namespace

const MmKernelTable& avx512_mm_kernels() {
  static const MmKernelTable table{"avx512",           Isa::kAvx512, &kAvx512Gemm,      nullptr,
                                   &avx512_gemv_f32(), nullptr,      &finish_row_avx512};
  return table;
}

// float32 operands keep the AVX-512 FMA kernels; the bfloat16 GEMV needs VBMI for its in-register decode, and takes
// M up to kAvx512Bf16GemvMaxM.
const MmKernelTable& avx512bf16_mm_kernels() {
  static const MmKernelTable table{"avx512-bf16",      Isa::kAvx512Bf16,
                                   &kAvx512Gemm,       &kAvx512Bf16Gemm,
                                   &avx512_gemv_f32(), cpu_features().avx512vbmi ? &kAvx512Bf16Gemv : nullptr,
                                   &finish_row_avx512, kAvx512Bf16GemvMaxM};
  return table;
}

// float32 operands keep the AVX-512 FMA kernels, GEMV the AVX512-BF16 (or FMA) register kernels up to kGemvMaxM
// (from M = 5 on the AMX stream GEMM decodes the weights once into its tiles).
const MmKernelTable& amx_mm_kernels() {
  static const MmKernelTable table{"amx",
                                   Isa::kAmx,
                                   &kAvx512Gemm,
                                   &kAmxGemm,
                                   &avx512_gemv_f32(),
                                   cpu_features().avx512vbmi ? &kAvx512Bf16Gemv : nullptr,
                                   &finish_row_avx512};
  return table;
}

const detail::IsaTables<MmKernelTable>& mm_tables() {
  static const detail::IsaTables<MmKernelTable> tables(
      {&scalar_mm_kernels(), &avx2_mm_kernels(), &avx512_mm_kernels(), &avx512bf16_mm_kernels(), &amx_mm_kernels()});
  return tables;
}

}  // namespace fp8kit::mm_detail
