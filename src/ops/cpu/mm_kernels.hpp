// Internal: the matrix-multiply kernels (one table per instruction set) and what they share with the driver.
// Kernels know nothing of operands, layouts or threads: scaled_mm.cpp packs panels, splits work and dispatches.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/dispatch.hpp"
#include "fp8kit/format.hpp"

namespace fp8kit::mm_detail {

// The packed GEMM micro-tile: kMr rows of A by kNr columns of B, in FP32 registers.
inline constexpr std::int64_t kMr = 6;
inline constexpr std::int64_t kNr = 16;

// The dequantization scale of output row (of A) or column (of B) r in K block kb:
// data[(r / r_div) * r_stride + kb * kb_stride] (per tensor: both strides 0).
struct ScaleIndex {
  const float* data = nullptr;
  std::int64_t r_div = 1, r_stride = 0, kb_stride = 0;
  float at(std::int64_t r, std::int64_t kb) const { return data[(r / r_div) * r_stride + kb * kb_stride]; }
};

// The exact float value of each of the 256 codes of a format (NaN codes decode to NaN).
using DecodeTable = std::array<float, 256>;
const DecodeTable& decode_table(Format f);

// C (kMr x kNr, row stride ldc) and a packed K range: a[k * kMr + i], b[k * kNr + j].
//   accumulate  C[i][j] = C[i][j] + sum_k a*b, one fused multiply-add per k in increasing k (C holds the running
//               FP32 sum between calls, so the sum is the same as one uninterrupted accumulation)
//   scale       acc = sum_k a*b from 0; C[i][j] = fma(acc * sa[i], sb[j], C[i][j]) (one K block of a blocked
//               product, the reference's order)
using AccumulateFn = void (*)(std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc);
using ScaleAccumulateFn = void (*)(std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc,
                                   const float* sa, const float* sb);

// The activation rows of a GEMV: m <= kGemvRows rows of k floats (row stride ldx). `rebiased`, when not null, is
// the same rows times 2^(127 - bias - c) exactly (bias: the weights' format's; the driver checks nothing overflows),
// which lets a kernel use the FP8 codes' bit patterns as floats without multiplying each by 2^(127 - bias); the
// sums it gets that way are then multiplied by sum_scale = 2^c.
struct GemvInput {
  const float* x = nullptr;
  std::int64_t ldx = 0;
  const float* rebiased = nullptr;
  float sum_scale = 1.0f;
};

// GEMV: output columns [j0, j1) of the rows of x times the FP8 weights w (row j at w + j * k): per K block of
// `kblock`, lane-parallel FP32 partial sums of x[i][k] * decode(w[j][k]) (fused multiply-adds), added up per block
// and scaled as the reference does: total = fma(sum * sa(i, kb), sb(j, kb), total); out[i * ldo + j] = total.
// Returns false when it cannot decode the codes of these rows exactly (an Inf or NaN code, or denormals-are-zero
// set on the calling thread): the driver then recomputes the range with the scalar table's kernel, which always
// succeeds.
inline constexpr std::int64_t kGemvRows = 4;
using GemvFn = bool (*)(Format f, std::int64_t m, std::int64_t j0, std::int64_t j1, std::int64_t k, std::int64_t kblock,
                        const GemvInput& x, const std::uint8_t* w, ScaleIndex sa, ScaleIndex sb, float* out,
                        std::int64_t ldo);

// The scales of an unblocked product, on the finished sums: row[j] = fma(row[j] * sa, sb(j, 0), 0) for j < n.
using ScaleRowFn = void (*)(float* row, std::int64_t n, float sa, ScaleIndex sb);

struct MmKernelTable {
  std::string_view name;
  Isa isa;
  AccumulateFn accumulate;
  ScaleAccumulateFn scale_accumulate;
  ScaleRowFn scale_row;
  GemvFn gemv;
};

const MmKernelTable& scalar_mm_kernels();
const MmKernelTable& avx2_mm_kernels();
const detail::IsaTables<MmKernelTable>& mm_tables();
inline const MmKernelTable& active_mm_kernels() {
  return mm_tables().active();
}

}  // namespace fp8kit::mm_detail
