// Internal, for the AVX-512 GEMVs that decode their weights through the VBMI byte tables (float32 activations in
// mm_avx512.cpp, bfloat16 ones in mm_avx512bf16.cpp): the loop over K blocks around their 64-K steps. Internal
// linkage: each kernel file keeps its own copy, compiled with its own flags.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "mm_kernels.hpp"

namespace fp8kit::mm_detail {
namespace {

// kM activation rows times kR weight rows starting at row j, over all of K. Per K block of kblock: one FP32
// accumulator vector per output, zeroed; step.template operator()<kFull>(acc, kk, len) adds K [kk, kk + len) into
// them, 64 at a time (kFull, len = 64) and then the block's last len < 64 (the step reads under masks: code 0 is +0,
// and the activations past the block are read as zeros); then the block's sum (its lanes added), scaled as the
// reference does: total = fma(sum * sa, sb, total). Finally out[i * ldo + j + r] = total.
template <int kM, int kR, class Step>
[[gnu::always_inline]] inline void gemv_k_blocks(std::int64_t j, std::int64_t k, std::int64_t kblock,
                                                 const ScaleIndex& sa, const ScaleIndex& sb, float* out,
                                                 std::int64_t ldo, const Step& step) {
  float total[kM][kR] = {};
  for (std::int64_t k0 = 0, kb = 0; k0 < k; k0 += kblock, ++kb) {
    const std::int64_t k1 = std::min(k, k0 + kblock);
    __m512 acc[kM][kR];
#pragma GCC unroll 4
    for (int i = 0; i < kM; ++i)
#pragma GCC unroll 8
      for (int r = 0; r < kR; ++r) acc[i][r] = _mm512_setzero_ps();
    std::int64_t kk = k0;
    for (; kk + 64 <= k1; kk += 64) step.template operator()<true>(acc, kk, std::int64_t{64});
    if (kk < k1) {
      step.template operator()<false>(acc, kk, k1 - kk);
    }
#pragma GCC unroll 4
    for (int i = 0; i < kM; ++i) {
      const float s = sa.at(i, kb);
#pragma GCC unroll 8
      for (int r = 0; r < kR; ++r)
        total[i][r] = std::fma(_mm512_reduce_add_ps(acc[i][r]) * s, sb.at(j + r, kb), total[i][r]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < kM; ++i)
#pragma GCC unroll 8
    for (int r = 0; r < kR; ++r) out[i * ldo + j + r] = total[i][r];
}

// The mask of the first n (0 to 64) of 64 elements.
[[gnu::always_inline]] inline __mmask64 first_n64(std::int64_t n) {
  return n >= 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1;
}

}  // namespace
}  // namespace fp8kit::mm_detail
