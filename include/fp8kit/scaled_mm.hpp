// scaled_mm: FP8 matrix multiplication with dequantization scales and FP32 accumulation, with the semantics of
// torch._scaled_mm (A M x K, B as weights N x K or as K x N): the plain reference, the fast dispatched entry
// (packed AVX2 GEMM, a GEMV / small-M path, threads), and weight-only FP8 products for inference.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
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

// Which kernel computed a product (the dispatcher's decision, for profilers and tests).
enum class MmPath : std::uint8_t {
  kReference,  // scaled_mm_reference
  kGemm,       // packed panels, FP32 FMA micro-kernel (AVX2) or its scalar twin
  kGemv,       // small M: weights streamed once, decoded in registers
};
std::string_view name(MmPath path);

struct ScaledMmResult {
  std::int64_t m = 0, n = 0;
  std::vector<float> out;  // m x n, row-major; bfloat16 outputs are already rounded to bfloat16 values
  float amax = 0.0f;       // max |out| over finite values (the next layer's scale needs it)
  MmPath path = MmPath::kReference;
};

// The reference: out[i][j] = sum over K blocks of (sum_k a[i][k] * b[k][j], accumulated in FP32 in increasing k)
// * scale_a(i, block) * scale_b(block, j), + bias[j]. Supported scales: A per tensor, per row or 1 x Kb blocks;
// B per tensor, per output channel (a row of N x K) or Kb x Nb blocks (128 x 128 as DeepSeek-V3), with the same
// K block size on both sides when both are blocked. e5m2 x e5m2 is refused, as cuBLAS and PyTorch refuse it.
// Throws fp8kit::Error (kInvalidArgument) naming what does not fit.
ScaledMmResult scaled_mm_reference(const ScaledMatrix& a, const ScaledMatrix& b, const ScaledMmOptions& options = {});

// The fast entry, same semantics and checks as the reference. The dispatcher takes the GEMV path when M is at
// most kGemvMaxM and B is N x K (the weight layout), the packed GEMM otherwise. The GEMM path accumulates
// every output in increasing k like the reference and applies scales in the same order, so its results are
// bit-identical to scaled_mm_reference; the GEMV path sums each row in 8-lane partial sums (within the FP32
// accumulation bound of docs/gemm.md, and exact when the sums are). Threads: OpenMP (set_num_threads).
ScaledMmResult scaled_mm(const ScaledMatrix& a, const ScaledMatrix& b, const ScaledMmOptions& options = {});
// The same into a caller's buffer of m x n floats (no allocation for the output); returns the output amax.
float scaled_mm_into(const ScaledMatrix& a, const ScaledMatrix& b, std::span<float> out,
                     const ScaledMmOptions& options = {}, MmPath* path = nullptr);

// The largest M the dispatcher sends to the GEMV path.
inline constexpr std::int64_t kGemvMaxM = 4;

// A float32 or bfloat16 matrix (activations of weight-only FP8 products, operands of matmul): rows x cols,
// row-major.
struct ActivationView {
  const void* data = nullptr;
  DType dtype = DType::float32;  // float32 or bfloat16
  std::int64_t rows = 0, cols = 0;
};

// Weight-only FP8 (inference): out (M x N, float32) = x (M x K, float32 or bfloat16) times dequant(w)^T + bias,
// w the N x K weights with scales per tensor, per output channel (row) or blocks (128 x 128). Per K block,
// sum_k x[i][k] * decode(w[j][k]) is accumulated in FP32 with fused multiply-adds, then multiplied by the
// block's scale. Small M streams the weights once (GEMV path); larger M dequantizes weight panels into the
// packed GEMM. Throws fp8kit::Error naming what does not fit.
void fp8_weight_mm(ActivationView x, const ScaledMatrix& w, std::span<float> out, std::span<const float> bias = {},
                   MmPath* path = nullptr);
// Plain float GEMM on the same kernels (what the fp32 and bf16 training recipes use): out (M x N) = a (M x K) times
// b (N x K for kNK, K x N for kKN), float32 or bfloat16 operands (bfloat16 widened exactly), FP32 accumulation
// with one fused multiply-add per product in increasing k, + bias. Bit-identical to matmul_reference.
void matmul(ActivationView a, ActivationView b, BLayout b_layout, std::span<float> out,
            std::span<const float> bias = {});
void matmul_reference(ActivationView a, ActivationView b, BLayout b_layout, std::span<float> out,
                      std::span<const float> bias = {});

// The plain loops fp8_weight_mm is tested against (FMA products in increasing k per K block).
void fp8_weight_mm_reference(ActivationView x, const ScaledMatrix& w, std::span<float> out,
                             std::span<const float> bias = {});

}  // namespace fp8kit
