// scaled_mm: FP8 matrix multiplication with dequantization scales and FP32 accumulation, with the semantics of
// torch._scaled_mm (A M x K, B as weights N x K or as K x N): the plain reference, the fast dispatched entry
// (packed GEMM kernels per ISA level: FP32 FMA, AVX512-BF16, AMX; a GEMV / small-M path; threads), the results
// contract each kernel keeps, and weight-only FP8 products for inference.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/kernel_contract.hpp"
#include "fp8kit/scaling/quantize.hpp"
#include "fp8kit/tensor/dtype.hpp"
#include "fp8kit/tensor/matrix_ref.hpp"

namespace fp8kit {

// How B's ScaledTensor is laid out: as weights (rows = N output channels, cols = K) or as K x N.
enum class BLayout : std::uint8_t { kNK, kKN };

struct ScaledMmOptions {
  BLayout b_layout = BLayout::kNK;
  DType out_dtype = DType::float32;  // float32 or bfloat16
  std::span<const float> bias = {};  // N values added in FP32 before the output conversion, or empty
};

// Which kernel computed a product (the dispatcher's decision, for profilers and tests).
enum class MmPath : std::uint8_t {
  kReference,  // scaled_mm_reference
  kGemm,       // packed panels and a micro-kernel (FP32 FMA, vdpbf16ps or AMX tiles)
  kGemv,       // small M: weights streamed once, decoded in registers
};
std::string_view name(MmPath path);

// The kFp32Bound contract for one output (docs/gemm.md derives it): with `k` the K length, `abs_products` the exact
// sum over k of |a_k * b_k * scale_a * scale_b| (scales of the k's block), `abs_exact` the exact |result| (bias
// included), `max_scale` the largest |scale_a * scale_b| of its blocks and `max_operand` the largest |value| of
// either operand before its scales (a decoded FP8 code, an activation),
//   |out - exact| <= (2k + 8) u abs_products + 2 u abs_exact + 2 k 2^-126 max(1, max_operand) max_scale,
//   u = 2^-24.
// (2k + 8) u: at most k - 1 roundings of the sum in any order (products of FP8 or bfloat16 values are exact in
// FP32; a float32 activation times a weight rounds once more), two per K block for its scales and one per block
// added, and the bias; 2 u |exact|: the last additions; the last term: the subnormal flushes of vdpbf16ps and AMX,
// per k one input read as zero (a bfloat16 a below 2^-126 drops a * b, less than 2^-126 |b|) and one result.
// A bfloat16 output adds its own rounding (2^-8 relative) on top.
double mm_error_bound(std::int64_t k, double abs_products, double abs_exact, double max_scale = 1.0,
                      double max_operand = 1.0);

// What computed one product: the path, the kernel, its contract and its ISA level.
struct MmDispatch {
  MmPath path = MmPath::kReference;
  std::string_view kernel;  // e.g. "amx-bf16 32x32", "avx2-fma 6x16", "avx512bf16-gemv"
  KernelContract contract = KernelContract::kBitIdentical;
  Isa isa = Isa::kScalar;
};

// The largest M the dispatcher sends to the GEMV path at every level (B as N x K); with left operands exact in
// bfloat16 (FP8, bfloat16 activations) a level may take more (MmKernels::gemv_max_m).
inline constexpr std::int64_t kGemvMaxM = 4;

// The kernels the dispatcher runs at the level in force: for FP8 (or bfloat16) operands and for float32 ones.
struct MmKernels {
  Isa isa;
  std::string_view gemm, gemv;          // scaled_mm; fp8_weight_mm with bfloat16 activations
  std::string_view gemm_f32, gemv_f32;  // matmul; fp8_weight_mm with float32 activations
  KernelContract gemm_contract, gemv_contract, gemm_f32_contract, gemv_f32_contract;
  std::string_view gemm_small_m;  // the GEMM for gemv_max_m < M <= small_m_max with N x K weights, or empty
  std::int64_t small_m_max = 0;
  // The GEMV path's largest M for FP8 / bfloat16 left operands (AVX2 and AVX512-BF16 without AMX: 16).
  std::int64_t gemv_max_m = kGemvMaxM;
};
MmKernels mm_kernels();

struct ScaledMmResult {
  std::int64_t m = 0, n = 0;
  std::vector<float> out;  // m x n, row-major; bfloat16 outputs are already rounded to bfloat16 values
  float amax = 0.0f;       // max |out| over finite values (the next layer's scale needs it)
  MmPath path = MmPath::kReference;
  MmDispatch dispatch;  // the kernel that computed it (path included)
};

// The reference: out[i][j] = sum over K blocks of (sum_k a[i][k] * b[k][j], accumulated in FP32 in increasing k)
// * scale_a(i, block) * scale_b(block, j), + bias[j]. Supported scales: A per tensor, per row or 1 x Kb blocks;
// B per tensor, per output channel (a row of N x K) or Kb x Nb blocks (128 x 128 as DeepSeek-V3), with the same
// K block size on both sides when both are blocked. e5m2 x e5m2 is refused, as cuBLASLt (and torch._scaled_mm on
// CUDA) refuses it.
// Throws fp8kit::Error (kInvalidArgument) naming what does not fit.
ScaledMmResult scaled_mm_reference(const ScaledTensorRef& a, const ScaledTensorRef& b,
                                   const ScaledMmOptions& options = {});

// The fast entry, same semantics and checks as the reference. The dispatcher takes the GEMV path when M is at
// most kGemvMaxM (mm_kernels().gemv_max_m for FP8 A) and B is N x K (the weight layout), the packed GEMM otherwise,
// with the kernels of the level in force (mm_kernels()). The FP32 FMA GEMM kernels (scalar, avx2, avx512) are
// bit-identical to scaled_mm_reference; the AVX512-BF16 and AMX kernels and every GEMV sum in another order and keep
// the kFp32Bound contract (exact when the sums are). Results never depend on the thread count (OpenMP,
// set_num_threads).
ScaledMmResult scaled_mm(const ScaledTensorRef& a, const ScaledTensorRef& b, const ScaledMmOptions& options = {});
// The same into a caller's buffer of m x n floats (no allocation for the output); returns the output amax.
float scaled_mm_into(const ScaledTensorRef& a, const ScaledTensorRef& b, std::span<float> out,
                     const ScaledMmOptions& options = {}, MmDispatch* dispatch = nullptr);

// The float operands below (activations of weight-only FP8 products, operands of matmul) are MatrixRefs of float32
// or bfloat16 on the CPU, any row stride.
//
// Weight-only FP8 (inference): out (M x N, float32) = x (M x K, float32 or bfloat16) times dequant(w)^T + bias,
// w the N x K weights with scales per tensor, per output channel (row) or blocks (128 x 128). Per K block,
// sum_k x[i][k] * decode(w[j][k]) is accumulated in FP32, then multiplied by the block's scale. Small M streams
// the weights once (GEMV path); larger M decodes weight panels into the packed GEMM. float32 activations run the
// FP32 FMA GEMM kernels (bit-identical to fp8_weight_mm_reference) and, for M <= kGemvMaxM, the level's register
// GEMV (lane-parallel partial sums: kFp32Bound, the scalar level's excepted); bfloat16 ones, exact in bfloat16, the
// level's bfloat16 kernels where it has them (kFp32Bound). `dispatch` says which ran and under which contract.
// Throws fp8kit::Error naming what does not fit.
void fp8_weight_mm(MatrixRef x, const ScaledTensorRef& w, std::span<float> out, std::span<const float> bias = {},
                   MmDispatch* dispatch = nullptr);
// Plain float GEMM on the FP32 FMA kernels (what the fp32 and bf16 training recipes use): out (M x N) = a (M x K)
// times b (N x K for kNK, K x N for kKN), float32 or bfloat16 operands (bfloat16 widened exactly), FP32
// accumulation with one fused multiply-add per product in increasing k, + bias. Bit-identical to matmul_reference
// at every ISA level.
void matmul(MatrixRef a, MatrixRef b, BLayout b_layout, std::span<float> out, std::span<const float> bias = {});
void matmul_reference(MatrixRef a, MatrixRef b, BLayout b_layout, std::span<float> out,
                      std::span<const float> bias = {});

// The plain loops fp8_weight_mm is tested against (FMA products in increasing k per K block).
void fp8_weight_mm_reference(MatrixRef x, const ScaledTensorRef& w, std::span<float> out,
                             std::span<const float> bias = {});

}  // namespace fp8kit
