// What a kernel table promises about its results, one vocabulary for every kernel family (conversions, amax, GEMM,
// GEMV; the CUDA kernels later): tests check each table against the contract it declares.
#pragma once

#include <cstdint>
#include <string_view>

namespace fp8kit {

enum class KernelContract : std::uint8_t {
  // The scalar reference's results, bit for bit, on every input. Conversions and amax are always this (their
  // results are exact); a GEMM is when it keeps the reference's FP32 sums in the reference's order (one rounding
  // per product-add, increasing k): the bits of scaled_mm_reference / fp8_weight_mm_reference / matmul_reference.
  kBitIdentical,
  // FP32 sums in another order (vector lanes, bfloat16 pairs, AMX tiles of 32): within the family's stated bound of
  // the exact value, one function with its derivation (GEMMs: mm_error_bound in fp8kit/ops/scaled_mm.hpp and
  // docs/gemm.md). The AVX512-BF16 and AMX kernels also read bfloat16 subnormals as zero and flush subnormal
  // products and sums (the instructions' fixed DAZ/FTZ); with FP8 operands on both sides that never happens.
  kFp32Bound,
};
std::string_view name(KernelContract contract);  // "bit-identical", "fp32-bound"

}  // namespace fp8kit
