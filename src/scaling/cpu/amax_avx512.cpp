// AVX-512 amax: |x| as integer bits (finite magnitudes order like unsigned integers, NaN and Inf above them), the
// maximum of the finite ones through a masked max, non-finite elements counted in 32-bit lanes through a masked
// add, and split into NaN and Inf only when there are any.
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>

#include "amax_kernels.hpp"

namespace fp8kit::scaling_detail {
namespace {

struct Lanes {
  __m512i max = _mm512_setzero_si512();
  __m512i nonfinite = _mm512_setzero_si512();
};

// One vector: finite magnitudes into the max, non-finite (|x| > largest finite as integers) counted.
[[gnu::always_inline]] inline void step(const float* p, __mmask16 valid, Lanes& l) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
  const __m512i a = _mm512_and_si512(_mm512_maskz_loadu_epi32(valid, p), abs_mask);
  const __mmask16 bad = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F7FFFFF));
  l.max = _mm512_mask_max_epu32(l.max, static_cast<__mmask16>(~bad), l.max, a);
  l.nonfinite = _mm512_mask_add_epi32(l.nonfinite, bad, l.nonfinite, _mm512_set1_epi32(1));
}
[[gnu::always_inline]] inline void step(const float* p, Lanes& l) {
  const __m512i a = _mm512_and_si512(_mm512_loadu_si512(p), _mm512_set1_epi32(0x7FFFFFFF));
  const __mmask16 bad = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F7FFFFF));
  l.max = _mm512_mask_max_epu32(l.max, static_cast<__mmask16>(~bad), l.max, a);
  l.nonfinite = _mm512_mask_add_epi32(l.nonfinite, bad, l.nonfinite, _mm512_set1_epi32(1));
}

// Elements per counter flush: each lane counts at most one per 16 elements, so lanes stay below 2^31.
constexpr std::size_t kFlush = std::size_t{16} << 26;

void amax_avx512(const float* x, std::size_t n, AmaxResult& acc) {
  Lanes l0, l1;
  std::uint64_t nonfinite = 0;
  std::size_t i = 0;
  while (n - i >= 64) {
    const std::size_t end = i + std::min(kFlush, (n - i) / 64 * 64);
    for (; i < end; i += 64) {
      step(x + i, l0);
      step(x + i + 16, l1);
      step(x + i + 32, l0);
      step(x + i + 48, l1);
    }
    nonfinite += static_cast<std::uint64_t>(_mm512_reduce_add_epi32(_mm512_add_epi32(l0.nonfinite, l1.nonfinite)));
    l0.nonfinite = l1.nonfinite = _mm512_setzero_si512();
  }
  for (; i < n; i += 16) step(x + i, static_cast<__mmask16>(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1u), l0);
  nonfinite += static_cast<std::uint64_t>(_mm512_reduce_add_epi32(_mm512_add_epi32(l0.nonfinite, l1.nonfinite)));
  split_nonfinite(x, n, nonfinite, acc);
  const auto max_bits = static_cast<std::uint32_t>(_mm512_reduce_max_epu32(_mm512_max_epu32(l0.max, l1.max)));
  acc.amax = std::max(acc.amax, std::bit_cast<float>(max_bits));
}

// Lane i of the result: the maximum of the 16 lanes of v[i]. Four rounds halve the vectors, each merging pairs
// (a, b) into max(evens(a, b), odds(a, b)): 45 operations for 16 maxima, against 8 per vector one at a time.
[[gnu::always_inline]] inline __m512i horizontal_max16(__m512i v[16]) {
  const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odds = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  for (int count = 16; count > 1; count /= 2) {
    for (int j = 0; j < count / 2; ++j) {
      const __m512i a = v[2 * j], b = v[2 * j + 1];
      v[j] = _mm512_max_epu32(_mm512_permutex2var_epi32(a, evens, b), _mm512_permutex2var_epi32(a, odds, b));
    }
  }
  return v[0];
}

// The maximum of |x| as bits over one segment of kVectors * 16 elements (kVectors = 0: `segment` elements, a
// multiple of 16), NaN and Inf included (they order above every finite magnitude); two chains for longer segments.
template <std::size_t kVectors>
[[gnu::always_inline]] inline __m512i raw_segment_max(const float* seg, std::size_t segment) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
  const std::size_t vectors = kVectors != 0 ? kVectors : segment / 16;
  __m512i m0 = _mm512_setzero_si512(), m1 = _mm512_setzero_si512();
  std::size_t v = 0;
  for (; v + 2 <= vectors; v += 2) {  // (prefetches into L2: docs/scaling.md, "Prefetching into L2")
    _mm_prefetch(reinterpret_cast<const char*>(seg + 16 * v) + 2048, _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(seg + 16 * v) + 2048 + 64, _MM_HINT_T1);
    m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_loadu_si512(seg + 16 * v), abs_mask));
    m1 = _mm512_max_epu32(m1, _mm512_and_si512(_mm512_loadu_si512(seg + 16 * v + 16), abs_mask));
  }
  if (v < vectors) m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_loadu_si512(seg + 16 * v), abs_mask));
  return _mm512_max_epu32(m0, m1);
}

// Per segment (a multiple of 16 elements): the maximum of |x| bits over its vectors, 16 segments' horizontal
// maxima at once. A segment whose maximum is not finite holds a NaN or an Inf: the scalar loop redoes it (its
// finite maximum and its counts), so the common, finite case pays for no counting at all. Partial segments go to
// the scalar loop too.
template <std::size_t kVectors>
void amax_segments_body(const float* x, std::size_t n, std::size_t segment, float* out, AmaxResult& acc) {
  const std::size_t segments = n / segment;
  const __m512i largest_finite = _mm512_set1_epi32(0x7F7FFFFF);
  __m512i overall = _mm512_setzero_si512();
  std::size_t k = 0;
  for (; k + 16 <= segments; k += 16) {
    __m512i m[16];
    for (std::size_t t = 0; t < 16; ++t) m[t] = raw_segment_max<kVectors>(x + (k + t) * segment, segment);
    const __m512i maxima = horizontal_max16(m);
    _mm512_storeu_si512(out + k, maxima);
    auto nonfinite = static_cast<std::uint32_t>(_mm512_cmpgt_epu32_mask(maxima, largest_finite));
    overall = _mm512_mask_max_epu32(overall, static_cast<__mmask16>(~nonfinite), overall, maxima);
    for (; nonfinite != 0; nonfinite &= nonfinite - 1) {
      const std::size_t t = k + static_cast<std::size_t>(std::countr_zero(nonfinite));
      amax_segments_scalar(x + t * segment, segment, segment, out + t, acc);
    }
  }
  for (; k < segments; ++k) {
    const auto bits =
        static_cast<std::uint32_t>(_mm512_reduce_max_epu32(raw_segment_max<kVectors>(x + k * segment, segment)));
    if (bits > 0x7F7FFFFFu) {
      amax_segments_scalar(x + k * segment, segment, segment, out + k, acc);
    } else {
      out[k] = std::bit_cast<float>(bits);
      acc.amax = std::max(acc.amax, out[k]);
    }
  }
  acc.amax = std::max(acc.amax, std::bit_cast<float>(static_cast<std::uint32_t>(_mm512_reduce_max_epu32(overall))));
  if (k * segment < n) amax_segments_scalar(x + k * segment, n - k * segment, segment, out + k, acc);
}

void amax_segments_avx512(const float* x, std::size_t n, std::size_t segment, float* out, AmaxResult& acc) {
  if (segment % 16 != 0 || segment == 0) {
    amax_segments_scalar(x, n, segment, out, acc);
    return;
  }
  // MX's 32 and the 1x128 blocks unrolled; other lengths in the general loop.
  if (segment == 32) return amax_segments_body<2>(x, n, segment, out, acc);
  if (segment == 128) return amax_segments_body<8>(x, n, segment, out, acc);
  amax_segments_body<0>(x, n, segment, out, acc);
}

}  // namespace

const AmaxTable& avx512_amax_kernels() {
  static const AmaxTable table{"avx512", Isa::kAvx512, KernelContract::kBitIdentical, &amax_avx512,
                               &amax_segments_avx512};
  return table;
}

}  // namespace fp8kit::scaling_detail
