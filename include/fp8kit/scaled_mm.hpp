// scaled_mm: FP8 matrix multiplication with dequantization scales and FP32 accumulation, with the semantics of
// torch._scaled_mm (A M x K, B as weights N x K or as K x N). This header declares the plain reference; fast
// kernels (the GEMM issue) are checked against it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "fp8kit/dtype.hpp"
#include "fp8kit/quantize.hpp"

namespace fp8kit {

// How B's ScaledMatrix is laid out: as weights (rows = N output channels, cols = K) or as K x N.
enum class BLayout : std::uint8_t { kNK, kKN };

struct ScaledMmOptions {
  BLayout b_layout = BLayout::kNK;
  DType out_dtype = DType::float32;  // float32 or bfloat16
  std::span<const float> bias = {};  // N values added in FP32 before the output conversion, or empty
};

struct ScaledMmResult {
  std::int64_t m = 0, n = 0;
  std::vector<float> out;  // m x n, row-major; bfloat16 outputs are already rounded to bfloat16 values
  float amax = 0.0f;       // max |out| over finite values (the next layer's scale needs it)
};

// The reference: out[i][j] = sum over K blocks of (sum_k a[i][k] * b[k][j], accumulated in FP32 in increasing k)
// * scale_a(i, block) * scale_b(block, j), + bias[j]. Supported scales: A per tensor, per row or 1 x Kb blocks;
// B per tensor, per output channel (a row of N x K) or Kb x Nb blocks (128 x 128 as DeepSeek-V3), with the same
// K block size on both sides when both are blocked. e5m2 x e5m2 is refused, as cuBLAS and PyTorch refuse it.
// Throws fp8kit::Error (kInvalidArgument) naming what does not fit.
ScaledMmResult scaled_mm_reference(const ScaledMatrix& a, const ScaledMatrix& b, const ScaledMmOptions& options = {});

}  // namespace fp8kit
