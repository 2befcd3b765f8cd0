// Internal, for the AVX-512 GEMM micro-kernels (FP32 FMA, AVX512-BF16): the 12 x 32 tile of C they keep in 24 zmm
// accumulators, started and written back. Internal linkage: each kernel file keeps its own copy, compiled with its
// own flags.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace fp8kit::mm_detail {
namespace {

constexpr int kTileRows = 12;  // 12 rows of two 16-float vectors: 24 accumulators
using TileAcc = __m512[kTileRows][2];

// The tile's starting sums: zero for a scaled tile (its sums are scaled before they join C) or where asked, else C.
template <bool kScale>
[[gnu::always_inline]] inline void tile_start(TileAcc& acc, const float* c, std::int64_t ldc, bool zero) {
#pragma GCC unroll 12
  for (int i = 0; i < kTileRows; ++i) {
    if (kScale || zero) {
      acc[i][0] = _mm512_setzero_ps();
      acc[i][1] = _mm512_setzero_ps();
    } else {
      acc[i][0] = _mm512_loadu_ps(c + i * ldc);
      acc[i][1] = _mm512_loadu_ps(c + i * ldc + 16);
    }
  }
}

// Writes the tile to C: as it is, or (kScale) C + (sum * sa[i]) * sb[j], the reference's one fused rounding.
template <bool kScale>
[[gnu::always_inline]] inline void tile_finish(TileAcc& acc, float* c, std::int64_t ldc, const float* sa,
                                               const float* sb) {
  if constexpr (kScale) {
    const __m512 sb0 = _mm512_loadu_ps(sb), sb1 = _mm512_loadu_ps(sb + 16);
#pragma GCC unroll 12
    for (int i = 0; i < kTileRows; ++i) {
      const __m512 s = _mm512_set1_ps(sa[i]);
      acc[i][0] = _mm512_fmadd_ps(_mm512_mul_ps(acc[i][0], s), sb0, _mm512_loadu_ps(c + i * ldc));
      acc[i][1] = _mm512_fmadd_ps(_mm512_mul_ps(acc[i][1], s), sb1, _mm512_loadu_ps(c + i * ldc + 16));
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < kTileRows; ++i) {
    _mm512_storeu_ps(c + i * ldc, acc[i][0]);
    _mm512_storeu_ps(c + i * ldc + 16, acc[i][1]);
  }
}

}  // namespace
}  // namespace fp8kit::mm_detail
