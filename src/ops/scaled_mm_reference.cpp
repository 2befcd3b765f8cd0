// The reference scaled_mm: plain loops over the FP8 codes, FP32 accumulation per K block, scales applied per block.
// It is the specification the GEMM kernels are tested against, not a fast path.
#include <algorithm>
#include <cmath>

#include "fp8kit/error.hpp"
#include "fp8kit/scaled_mm.hpp"

namespace fp8kit {
namespace {

using Kind = Granularity::Kind;

bool is_e5m2_family(Format f) {
  return f == Format::e5m2 || f == Format::e5m2fnuz;
}

// The K extent of one scale block of an operand (K when its scale does not change along K).
std::int64_t k_block_of_a(const ScaledMatrix& a) {
  return a.granularity.kind == Kind::kBlock ? a.block_cols() : a.cols;
}
std::int64_t k_block_of_b(const ScaledMatrix& b, BLayout layout, std::int64_t k) {
  if (b.granularity.kind != Kind::kBlock) return k;
  return layout == BLayout::kNK ? b.block_cols() : b.block_rows();
}

}  // namespace

ScaledMmResult scaled_mm_reference(const ScaledMatrix& a, const ScaledMatrix& b, const ScaledMmOptions& options) {
  const bool nk = options.b_layout == BLayout::kNK;
  const std::int64_t m = a.rows, k = a.cols;
  const std::int64_t n = nk ? b.rows : b.cols;
  const std::int64_t kb_rows = nk ? b.cols : b.rows;
  FP8KIT_CHECK(kb_rows == k, "scaled_mm: A is ", m, "x", k, " but B has K = ", kb_rows,
               nk ? " (B given as N x K)" : " (B given as K x N)");
  FP8KIT_CHECK(!(is_e5m2_family(a.format) && is_e5m2_family(b.format)), "scaled_mm: ", name(a.format), " x ",
               name(b.format), " is not supported (no FP8 GEMM takes e5m2 x e5m2; quantize one side to e4m3)");
  FP8KIT_CHECK(a.granularity.kind == Kind::kTensor || a.granularity.kind == Kind::kRow ||
                   (a.granularity.kind == Kind::kBlock && a.granularity.block_rows == 1),
               "scaled_mm: A's scales must be per tensor, per row or 1 x K blocks, not ", a.granularity.name());
  const Kind per_channel = nk ? Kind::kRow : Kind::kColumn;
  FP8KIT_CHECK(
      b.granularity.kind == Kind::kTensor || b.granularity.kind == per_channel || b.granularity.kind == Kind::kBlock,
      "scaled_mm: B's scales must be per tensor, per output channel (", nk ? "row" : "col",
      " of this layout) or blocks, not ", b.granularity.name());
  FP8KIT_CHECK(options.out_dtype == DType::float32 || options.out_dtype == DType::bfloat16,
               "scaled_mm: the output must be float32 or bfloat16, not ", name(options.out_dtype));
  FP8KIT_CHECK(options.bias.empty() || static_cast<std::int64_t>(options.bias.size()) == n, "scaled_mm: bias has ",
               options.bias.size(), " values for N = ", n);
  const std::int64_t kba = k_block_of_a(a), kbb = k_block_of_b(b, options.b_layout, k);
  const bool a_blocked = a.granularity.kind == Kind::kBlock, b_blocked = b.granularity.kind == Kind::kBlock;
  FP8KIT_CHECK(!(a_blocked && b_blocked) || kba == kbb, "scaled_mm: A's K blocks (", kba, ") and B's (", kbb,
               ") differ; use the same K block size on both sides");
  const std::int64_t kstep =
      std::max<std::int64_t>(1, a_blocked ? kba : (b_blocked ? kbb : std::max<std::int64_t>(k, 1)));

  auto scale_a = [&](std::int64_t i, std::int64_t kb) {
    switch (a.granularity.kind) {
      case Kind::kTensor:
        return a.scale_inv[0];
      case Kind::kRow:
        return a.scale_inv[static_cast<std::size_t>(i)];
      default:
        return a.scale_inv[static_cast<std::size_t>(i * a.grid_cols() + (kb * kstep) / kba)];
    }
  };
  auto scale_b = [&](std::int64_t kb, std::int64_t j) {
    switch (b.granularity.kind) {
      case Kind::kTensor:
        return b.scale_inv[0];
      case Kind::kRow:
      case Kind::kColumn:
        return b.scale_inv[static_cast<std::size_t>(j)];
      default: {
        const std::int64_t kblock = (kb * kstep) / kbb;
        return nk ? b.scale_inv[static_cast<std::size_t>((j / b.block_rows()) * b.grid_cols() + kblock)]
                  : b.scale_inv[static_cast<std::size_t>(kblock * b.grid_cols() + j / b.block_cols())];
      }
    }
  };
  auto b_code = [&](std::int64_t kk, std::int64_t j) {
    return nk ? b.data[static_cast<std::size_t>(j * k + kk)] : b.data[static_cast<std::size_t>(kk * n + j)];
  };

  ScaledMmResult r;
  r.m = m;
  r.n = n;
  r.out.assign(static_cast<std::size_t>(m * n), 0.0f);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      float out = 0.0f;
      for (std::int64_t k0 = 0, kb = 0; k0 < k; k0 += kstep, ++kb) {
        float acc = 0.0f;  // FP32 accumulation within a K block, in increasing k
        for (std::int64_t kk = k0; kk < std::min(k, k0 + kstep); ++kk) {
          acc += decode_to_float(a.format, a.data[static_cast<std::size_t>(i * k + kk)]) *
                 decode_to_float(b.format, b_code(kk, j));
        }
        out += acc * scale_a(i, kb) * scale_b(kb, j);
      }
      if (!options.bias.empty()) out += options.bias[static_cast<std::size_t>(j)];
      if (options.out_dtype == DType::bfloat16) out = bfloat16::from_float(out).to_float();
      r.out[static_cast<std::size_t>(i * n + j)] = out;
      if (std::isfinite(out)) r.amax = std::max(r.amax, std::fabs(out));
    }
  }
  return r;
}

}  // namespace fp8kit
