// Internal, for the AVX-512 matrix kernels (packing, tile write-out): a 16 x 16 matrix of 32-bit elements transposed
// in registers. Internal linkage: each kernel file keeps its own copy, compiled with its own flags.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace fp8kit::mm_detail {
namespace {

// A 16 x 16 matrix of 32-bit elements, transposed in registers: four rounds that each swap the off-diagonal blocks
// of size b (8, 4, 2, 1), i.e. exchange bit b of the row and the column index where they differ.
struct TransposeIndex {
  TransposeIndex() {
    for (int round = 0; round < 4; ++round) {
      const int b = 8 >> round;
      alignas(64) std::int32_t lo_idx[16], hi_idx[16];
      for (int c = 0; c < 16; ++c) {
        lo_idx[c] = (c & b) != 0 ? 16 + (c ^ b) : c;
        hi_idx[c] = (c & b) != 0 ? 16 + c : (c ^ b);
      }
      lo[round] = _mm512_load_si512(lo_idx);
      hi[round] = _mm512_load_si512(hi_idx);
    }
  }
  __m512i lo[4], hi[4];
};

[[gnu::always_inline]] inline void transpose16x16(__m512i r[16], const TransposeIndex& t) {
#pragma GCC unroll 4
  for (int round = 0; round < 4; ++round) {
    const int b = 8 >> round;
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      if ((i & b) != 0) continue;
      const __m512i a = r[i], c = r[i | b];
      r[i] = _mm512_permutex2var_epi32(a, t.lo[round], c);
      r[i | b] = _mm512_permutex2var_epi32(a, t.hi[round], c);
    }
  }
}

}  // namespace
}  // namespace fp8kit::mm_detail
