// AVX2 amax: |x| as integer bits (finite magnitudes order like unsigned integers), four max accumulators, and
// NaN/Inf counted in 32-bit lanes, flushed to 64-bit totals every 2^24 vectors.
#include <immintrin.h>

#include <algorithm>
#include <bit>

#include "../kernels.hpp"
#include "fp8kit/cpu.hpp"

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

void amax_avx2(const float* x, std::size_t n, AmaxResult& acc) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i inf = _mm256_set1_epi32(0x7F800000);
  __m256i m0 = _mm256_setzero_si256(), m1 = m0, m2 = m0, m3 = m0;
  std::size_t i = 0;
  constexpr std::size_t kFlush = std::size_t{32} << 24;  // elements per counter flush (lanes stay below 2^31)
  while (n - i >= 32) {
    __m256i nans = _mm256_setzero_si256(), infs = nans;
    const std::size_t end = i + std::min(kFlush, (n - i) / 32 * 32);
    for (; i < end; i += 32) {
      const __m256i a0 =
          _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), abs_mask);
      const __m256i a1 =
          _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8)), abs_mask);
      const __m256i a2 =
          _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 16)), abs_mask);
      const __m256i a3 =
          _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 24)), abs_mask);
      // finite magnitudes are < inf as integers; NaN and Inf contribute 0 to the maximum and 1 to their
      // counter
      m0 = _mm256_max_epu32(m0, _mm256_and_si256(a0, _mm256_cmpgt_epi32(inf, a0)));
      m1 = _mm256_max_epu32(m1, _mm256_and_si256(a1, _mm256_cmpgt_epi32(inf, a1)));
      m2 = _mm256_max_epu32(m2, _mm256_and_si256(a2, _mm256_cmpgt_epi32(inf, a2)));
      m3 = _mm256_max_epu32(m3, _mm256_and_si256(a3, _mm256_cmpgt_epi32(inf, a3)));
      nans = _mm256_sub_epi32(
          nans, _mm256_add_epi32(_mm256_add_epi32(_mm256_cmpgt_epi32(a0, inf), _mm256_cmpgt_epi32(a1, inf)),
                                 _mm256_add_epi32(_mm256_cmpgt_epi32(a2, inf), _mm256_cmpgt_epi32(a3, inf))));
      infs = _mm256_sub_epi32(
          infs, _mm256_add_epi32(_mm256_add_epi32(_mm256_cmpeq_epi32(a0, inf), _mm256_cmpeq_epi32(a1, inf)),
                                 _mm256_add_epi32(_mm256_cmpeq_epi32(a2, inf), _mm256_cmpeq_epi32(a3, inf))));
    }
    acc.nan_count += lane_sum(nans);
    acc.inf_count += lane_sum(infs);
  }
  const std::uint32_t bits = lane_max(_mm256_max_epu32(_mm256_max_epu32(m0, m1), _mm256_max_epu32(m2, m3)));
  acc.amax = std::max(acc.amax, std::bit_cast<float>(bits));
  amax_scalar(x + i, n - i, acc);
}

// Per segment (a multiple of 8 elements): the maximum over its vectors, then one horizontal maximum; counters
// across all segments. Partial segments go to the scalar loop.
void amax_segments_avx2(const float* x, std::size_t n, std::size_t segment, float* out, AmaxResult& acc) {
  if (segment % 8 != 0 || segment == 0) {
    amax_segments_scalar(x, n, segment, out, acc);
    return;
  }
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i inf = _mm256_set1_epi32(0x7F800000);
  constexpr std::size_t kFlush = std::size_t{8} << 24;  // elements per counter flush
  __m256i nans = _mm256_setzero_si256(), infs = nans;
  __m256i overall = _mm256_setzero_si256();
  std::size_t since_flush = 0;
  std::size_t k = 0;
  for (; (k + 1) * segment <= n; ++k) {
    const float* seg = x + k * segment;
    __m256i m = _mm256_setzero_si256();
    for (std::size_t i = 0; i < segment; i += 8) {
      const __m256i a =
          _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(seg + i)), abs_mask);
      m = _mm256_max_epu32(m, _mm256_and_si256(a, _mm256_cmpgt_epi32(inf, a)));
      nans = _mm256_sub_epi32(nans, _mm256_cmpgt_epi32(a, inf));
      infs = _mm256_sub_epi32(infs, _mm256_cmpeq_epi32(a, inf));
    }
    overall = _mm256_max_epu32(overall, m);
    __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xB1));
    out[k] = std::bit_cast<float>(static_cast<std::uint32_t>(_mm_cvtsi128_si32(h)));
    since_flush += segment;
    if (since_flush >= kFlush) {
      acc.nan_count += lane_sum(nans);
      acc.inf_count += lane_sum(infs);
      nans = infs = _mm256_setzero_si256();
      since_flush = 0;
    }
  }
  acc.nan_count += lane_sum(nans);
  acc.inf_count += lane_sum(infs);
  acc.amax = std::max(acc.amax, std::bit_cast<float>(lane_max(overall)));
  if (k * segment < n) amax_segments_scalar(x + k * segment, n - k * segment, segment, out + k, acc);
}

}  // namespace

AmaxFn amax_avx2_kernel() {
  return cpu_features().avx2 ? &amax_avx2 : nullptr;
}
AmaxSegmentsFn amax_segments_avx2_kernel() {
  return cpu_features().avx2 ? &amax_segments_avx2 : nullptr;
}

}  // namespace fp8kit::scaling_detail
