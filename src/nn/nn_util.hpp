// Internal helpers the nn layers share: the threshold under which a loop stays on the calling thread, and shapes
// printed for error messages and profiler arguments.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <string>

#include "common/parallel.hpp"
#include "fp8kit/format/codec.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit::nn::detail {

// Below this many multiply-adds or element visits a parallel region costs more than it saves: smaller calls run on
// the calling thread (common/parallel.hpp). The result is the same either way.
using fp8kit::detail::kParallelWork;

// e^x in float32 from arithmetic alone, so that a loop over it vectorizes (libm's expf is a call per element) and
// its scalar remainder computes bit for bit the same function (no FMA contraction in the portable build):
//   n = round(x / ln 2) (the 1.5 * 2^23 addition leaves n in the low mantissa bits), r = x - n ln 2 with ln 2 split
//   in two (the high part has 9 significant bits, so n * hi is exact), e^r by its Taylor series to r^7 (|r| <= ln2/2:
//   the first term left out is below 6e-9, a tenth of an ulp), times 2^n built from the exponent bits.
// x is clamped to [-87, 88] (e^x stays a normal float: 2^-126 <= 2^n <= 2^127), so e^x is 1.6e-38 for x below -87
// and 1.65e38 above 88; NaN stays NaN. Within 2 ulp of the exact e^x over the clamped range (tests/nn).
inline float exp_approx(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;              // 355 / 512
  constexpr float kLn2Lo = -2.12194440054690583e-4f;  // ln 2 - kLn2Hi
  constexpr float kRound = 12582912.0f;               // 1.5 * 2^23
  x = x < -87.0f ? -87.0f : x;  // selects on values (std::min/max return references, which stop the vectorizer)
  x = x > 88.0f ? 88.0f : x;
  const float shifted = x * kLog2e + kRound;
  const float n = shifted - kRound;
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // shifted's bits are those of 1.5 * 2^23 (0x4B400000) plus n: the biased exponent of 2^n is n + 127.
  const std::uint32_t biased = std::bit_cast<std::uint32_t>(shifted) - 0x4B400000u + 127u;
  return p * std::bit_cast<float>(biased << 23);
}

// The first random stream of a dataset's held-out batches for a seed: a SplitMix64 finalization of the seed and a
// tag, so it is unrelated to the training streams seed * 0x9E3779B97F4A7C15 + step for every seed (0 included,
// where a plain bit flip of the training stream would land one step away from it).
inline std::uint64_t held_out_stream(std::uint64_t seed) {
  return splitmix64_finalize((seed ^ 0x48454C444F555421ull) + 0x9E3779B97F4A7C15ull);  // "HELDOUT!"
}

// dst (cols x rows, contiguous) = the rows x cols matrix at src, whose rows are src_stride elements apart,
// transposed; in 32 x 32 tiles, threaded for large matrices (a copy: the result never depends on threads). The one
// transpose of the nn layer: GEMM operands, the transposed quantization bands, NCHW <-> rows for convolutions.
template <typename T>
void transpose_into(const T* src, std::int64_t src_stride, T* dst, std::int64_t rows, std::int64_t cols) {
  constexpr std::int64_t kTile = 32;
  const bool parallel = rows * cols >= fp8kit::detail::kParallelLoopElements;
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) if (parallel)
  for (std::int64_t r0 = 0; r0 < rows; r0 += kTile) {
    for (std::int64_t c0 = 0; c0 < cols; c0 += kTile) {
      for (std::int64_t r = r0; r < std::min(rows, r0 + kTile); ++r) {
        for (std::int64_t c = c0; c < std::min(cols, c0 + kTile); ++c) dst[c * rows + r] = src[r * src_stride + c];
      }
    }
  }
}

using fp8kit::shape_string;

}  // namespace fp8kit::nn::detail
