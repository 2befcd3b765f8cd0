// AVX2 amax: |x| as integer bits (finite magnitudes order like unsigned integers, NaN and Inf above them),
// two max accumulators, non-finite elements counted in 32-bit lanes and split into NaN and Inf only when
// there are any.
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>

#include "amax_kernels.hpp"

namespace fp8kit::scaling_detail {
namespace {

std::uint64_t lane_sum(__m256i v) {
  alignas(32) std::uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), v);
  std::uint64_t sum = 0;
  for (std::uint32_t lane : lanes) sum += lane;
  return sum;
}

std::uint32_t lane_max(__m256i v) {
  alignas(32) std::uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), v);
  return *std::max_element(lanes, lanes + 8);
}

// One vector's step: finite magnitudes into the max, non-finite (|x| >= Inf as integers) counted.
inline void step(__m256i a, __m256i largest_finite, __m256i& max, __m256i& nonfinite) {
  const __m256i bad = _mm256_cmpgt_epi32(a, largest_finite);
  max = _mm256_max_epu32(max, _mm256_andnot_si256(bad, a));
  nonfinite = _mm256_sub_epi32(nonfinite, bad);
}

void amax_avx2(const float* x, std::size_t n, AmaxResult& acc) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i largest_finite = _mm256_set1_epi32(0x7F7FFFFF);
  __m256i m0 = _mm256_setzero_si256(), m1 = m0;
  std::uint64_t nonfinite = 0;
  std::size_t i = 0;
  constexpr std::size_t kFlush = std::size_t{32} << 24;  // elements per counter flush (lanes stay below 2^31)
  while (n - i >= 32) {
    __m256i bad0 = _mm256_setzero_si256(), bad1 = bad0;
    const std::size_t end = i + std::min(kFlush, (n - i) / 32 * 32);
    for (; i < end; i += 32) {
      auto load = [&](std::size_t k) {
        return _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + k)), abs_mask);
      };
      step(load(0), largest_finite, m0, bad0);
      step(load(8), largest_finite, m1, bad1);
      step(load(16), largest_finite, m0, bad0);
      step(load(24), largest_finite, m1, bad1);
    }
    nonfinite += lane_sum(_mm256_add_epi32(bad0, bad1));
  }
  split_nonfinite(x, i, nonfinite, acc);
  acc.amax = std::max(acc.amax, std::bit_cast<float>(lane_max(_mm256_max_epu32(m0, m1))));
  amax_scalar(x + i, n - i, acc);
}

// The maxima of the lanes of each of 8 vectors, in order: a transpose and maximum in three rounds (21 operations
// where 8 separate horizontal maxima take 64).
[[gnu::always_inline]] inline __m256i lane_maxima8(const __m256i (&m)[8]) {
  // Per 128-bit half: a pair's unpacks and max leave each vector's elements 0/2 and 1/3 combined; the next round's
  // 64-bit unpacks combine those, so each half holds the 4 vectors' maxima over its elements; the last round
  // combines the halves.
  const auto pair32 = [](__m256i a, __m256i b) {
    return _mm256_max_epu32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
  };
  const auto pair64 = [](__m256i a, __m256i b) {
    return _mm256_max_epu32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
  };
  const __m256i q0 = pair64(pair32(m[0], m[1]), pair32(m[2], m[3]));
  const __m256i q1 = pair64(pair32(m[4], m[5]), pair32(m[6], m[7]));
  return _mm256_max_epu32(_mm256_permute2x128_si256(q0, q1, 0x20), _mm256_permute2x128_si256(q0, q1, 0x31));
}

// Per segment (a multiple of 8 elements): the maximum over its vectors, then the horizontal maximum, for 8
// segments at a time where there are 8 (lane_maxima8; MX's 32-element segments spent a quarter of their operations
// on one horizontal maximum each: in L1 on Zen 3, 0.127 -> 0.117 ns per element, 128-element ones unchanged);
// counters across all segments. Partial segments go to the scalar loop.
void amax_segments_avx2(const float* x, std::size_t n, std::size_t segment, float* out, AmaxResult& acc) {
  if (segment % 8 != 0 || segment == 0) {
    amax_segments_scalar(x, n, segment, out, acc);
    return;
  }
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i largest_finite = _mm256_set1_epi32(0x7F7FFFFF);
  constexpr std::size_t kFlush = std::size_t{8} << 24;  // elements per counter flush
  __m256i bad = _mm256_setzero_si256();
  __m256i overall = _mm256_setzero_si256();
  std::uint64_t nonfinite = 0;
  std::size_t since_flush = 0;
  // The lane-wise maximum of segment k's finite magnitudes, its non-finite elements counted into `bad`.
  const auto segment_max = [&](std::size_t k) {
    const float* seg = x + k * segment;
    __m256i m = _mm256_setzero_si256();
    for (std::size_t i = 0; i < segment; i += 8) {
      if (i % 16 == 0) _mm_prefetch(reinterpret_cast<const char*>(seg + i) + 2048, _MM_HINT_T1);
      step(_mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(seg + i)), abs_mask), largest_finite, m,
           bad);
    }
    return m;
  };
  const auto count = [&](std::size_t elements) {
    since_flush += elements;
    if (since_flush >= kFlush) {
      nonfinite += lane_sum(bad);
      bad = _mm256_setzero_si256();
      since_flush = 0;
    }
  };
  std::size_t k = 0;
  for (; (k + 8) * segment <= n; k += 8) {
    __m256i m[8];
    for (std::size_t s = 0; s < 8; ++s) m[s] = segment_max(k + s);
    const __m256i maxima = lane_maxima8(m);
    overall = _mm256_max_epu32(overall, maxima);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), maxima);
    count(8 * segment);
  }
  for (; (k + 1) * segment <= n; ++k) {
    const __m256i m = segment_max(k);
    overall = _mm256_max_epu32(overall, m);
    __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xB1));
    out[k] = std::bit_cast<float>(static_cast<std::uint32_t>(_mm_cvtsi128_si32(h)));
    count(segment);
  }
  nonfinite += lane_sum(bad);
  split_nonfinite(x, k * segment, nonfinite, acc);
  acc.amax = std::max(acc.amax, std::bit_cast<float>(lane_max(overall)));
  if (k * segment < n) amax_segments_scalar(x + k * segment, n - k * segment, segment, out + k, acc);
}

}  // namespace

const AmaxTable& avx2_amax_kernels() {
  static const AmaxTable table{"avx2", Isa::kAvx2, KernelContract::kBitIdentical, &amax_avx2, &amax_segments_avx2};
  return table;
}

}  // namespace fp8kit::scaling_detail
