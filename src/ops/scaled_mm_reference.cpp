// The reference scaled_mm: plain loops over the FP8 codes, FP32 accumulation per K block, scales applied per block.
// It is the specification the GEMM kernels are tested against, not a fast path.
#include <algorithm>
#include <cmath>
#include <limits>

#include "common/disjoint.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/ops/scaled_mm.hpp"
#include "mm_plan.hpp"

namespace fp8kit {
namespace mm_detail {
namespace {

using Kind = Granularity::Kind;

bool is_e5m2_family(Format f) {
  return f == Format::e5m2 || f == Format::e5m2fnuz;
}
bool is_blocked(const ScaledTensorRef& x) {
  return x.granularity.kind == Kind::kBlock || x.granularity.kind == Kind::kMx;
}

void check_element_format(const char* what, const ScaledTensorRef& x) {
  fp8kit::check_element_format(x.format, what);  // the scaling layer's rule: e8m0fnu holds scales, not values
  FP8KIT_CHECK(static_cast<std::int64_t>(x.data.size()) == x.checked_numel(what), what, " has ", x.data.size(),
               " codes for a ", x.rows, "x", x.cols, " matrix");
  FP8KIT_CHECK(static_cast<std::int64_t>(x.scale_inv.size()) == x.grid_rows() * x.grid_cols(), what, " has ",
               x.scale_inv.size(), " scales for a ", x.grid_rows(), "x", x.grid_cols(), " block grid");
}

// Where B's scales live, as weights (N x K, output channel = row) or as K x N (output channel = column).
ScaleIndex b_scales(const ScaledTensorRef& b, bool nk) {
  ScaleIndex s{b.scale_inv.data()};
  switch (b.granularity.kind) {
    case Kind::kTensor:
      break;
    case Kind::kRow:
    case Kind::kColumn:
      s.r_stride = 1;
      break;
    default:
      if (nk) {
        s.r_div = b.block_rows();
        s.r_stride = b.grid_cols();
        s.kb_stride = 1;
      } else {
        s.r_div = b.block_cols();
        s.r_stride = 1;
        s.kb_stride = b.grid_cols();
      }
  }
  return s;
}

// B's checks, shared by both products: scales per tensor, per output channel or blocks.
void check_b_granularity(const char* what, const ScaledTensorRef& b, bool nk) {
  const Kind per_channel = nk ? Kind::kRow : Kind::kColumn;
  const Kind kind = b.granularity.kind;
  FP8KIT_CHECK(kind == Kind::kTensor || kind == per_channel || is_blocked(b), what,
               "'s scales must be per tensor, per output channel (", nk ? "row" : "col",
               " of this layout) or blocks, not ", b.granularity.name());
}

}  // namespace

MmPlan plan_shapes(const char* op, std::int64_t a_rows, std::int64_t a_cols, std::int64_t b_rows, std::int64_t b_cols,
                   bool nk, std::span<const float> bias) {
  FP8KIT_CHECK(a_rows >= 0 && a_cols >= 0 && b_rows >= 0 && b_cols >= 0, op, ": negative shape (A ", a_rows, "x",
               a_cols, ", B ", b_rows, "x", b_cols, ")");
  MmPlan p;
  p.m = a_rows;
  p.k = a_cols;
  p.n = nk ? b_rows : b_cols;
  const std::int64_t kb = nk ? b_cols : b_rows;
  std::int64_t mn = 0;
  FP8KIT_CHECK(!__builtin_mul_overflow(p.m, p.n, &mn) &&
                   mn <= std::numeric_limits<std::int64_t>::max() / static_cast<std::int64_t>(sizeof(float)),
               op, ": an ", p.m, "x", p.n, " output has more elements than memory can address");
  FP8KIT_CHECK(kb == p.k, op, ": A is ", p.m, "x", p.k, " but B has K = ", kb,
               nk ? " (B given as N x K)" : " (B given as K x N)");
  FP8KIT_CHECK(bias.empty() || static_cast<std::int64_t>(bias.size()) == p.n, op, ": bias has ", bias.size(),
               " values for N = ", p.n);
  p.kstep = std::max<std::int64_t>(1, p.k);
  p.sa = ScaleIndex{&kUnitScale};
  p.sb = ScaleIndex{&kUnitScale};
  return p;
}

void check_output(const char* op, const MmPlan& p, std::size_t out_size) {
  FP8KIT_CHECK(static_cast<std::int64_t>(out_size) == p.m * p.n, op, ": the output has ", out_size, " elements, ", p.m,
               "x", p.n, " needs ", p.m * p.n);
}

InputBytes input_bytes(const char* what, const MatrixRef& x) {
  x.check(what, x.dtype);  // its extent within int64 (a row stride near INT64_MAX wrapped the overlap test)
  if (x.rows <= 0 || x.cols <= 0) return {what, x.data, 0};
  return {what, x.data, static_cast<std::size_t>(((x.rows - 1) * x.stride() + x.cols) * element_size(x.dtype))};
}

void check_apart(const char* op, std::span<const float> out, std::initializer_list<InputBytes> inputs) {
  for (const InputBytes& in : inputs)
    detail::check_disjoint(op, in.what, in.data, in.bytes, out.data(), out.size_bytes());
}

MmPlan plan_scaled_mm(const ScaledTensorRef& a, const ScaledTensorRef& b, const ScaledMmOptions& options) {
  const bool nk = options.b_layout == BLayout::kNK;
  MmPlan p = plan_shapes("scaled_mm", a.rows, a.cols, b.rows, b.cols, nk, options.bias);
  check_element_format("scaled_mm: A", a);
  check_element_format("scaled_mm: B", b);
  FP8KIT_CHECK(
      !(is_e5m2_family(a.format) && is_e5m2_family(b.format)), "scaled_mm: ", name(a.format), " x ", name(b.format),
      " is not supported (as in cuBLASLt's FP8 GEMM, and so torch._scaled_mm on CUDA): quantize one side to e4m3fn");
  FP8KIT_CHECK(
      a.granularity.kind == Kind::kTensor || a.granularity.kind == Kind::kRow || (is_blocked(a) && a.block_rows() == 1),
      "scaled_mm: A's scales must be per tensor, per row or 1 x K blocks, not ", a.granularity.name());
  check_b_granularity("scaled_mm: B", b, nk);
  FP8KIT_CHECK(options.out_dtype == DType::float32 || options.out_dtype == DType::bfloat16,
               "scaled_mm: the output must be float32 or bfloat16, not ", name(options.out_dtype));
  const bool a_blocked = is_blocked(a), b_blocked = is_blocked(b);
  const std::int64_t kba = a_blocked ? a.block_cols() : p.k;
  const std::int64_t kbb = b_blocked ? (nk ? b.block_cols() : b.block_rows()) : p.k;
  // MX blocks run along a matrix's rows: on B given as K x N that is along N, so its K blocks are 1 long.
  const bool b_mx_across_n = !nk && b.granularity.kind == Kind::kMx;
  FP8KIT_CHECK(!(a_blocked && b_blocked) || kba == kbb, "scaled_mm: A's K blocks (", kba, ") and B's (", kbb,
               ") differ; ",
               b_mx_across_n ? "B is given as K x N, where MX blocks run along N: quantize B as N x K (its rows along "
                               "K) and pass BLayout::kNK"
                             : "use the same K block size on both sides");
  p.blocked = a_blocked || b_blocked;
  p.kstep = std::max<std::int64_t>(1, a_blocked ? kba : (b_blocked ? kbb : p.k));
  p.sa = ScaleIndex{a.scale_inv.data()};
  if (a.granularity.kind == Kind::kRow) p.sa.r_stride = 1;
  if (a_blocked) {
    p.sa.r_stride = a.grid_cols();
    p.sa.kb_stride = 1;
  }
  p.sb = b_scales(b, nk);
  return p;
}

MmPlan plan_weight_mm(const MatrixRef& x, const ScaledTensorRef& w, std::span<const float> bias, std::size_t out_size) {
  FP8KIT_CHECK(x.dtype == DType::float32 || x.dtype == DType::bfloat16,
               "fp8_weight_mm: activations must be float32 or bfloat16, not ", name(x.dtype));
  x.check("fp8_weight_mm: activations", x.dtype);
  check_element_format("fp8_weight_mm: the weights", w);
  check_b_granularity("fp8_weight_mm: the weights", w, true);
  MmPlan p = plan_shapes("fp8_weight_mm", x.rows, x.cols, w.rows, w.cols, true, bias);
  check_output("fp8_weight_mm", p, out_size);
  p.blocked = is_blocked(w);
  p.kstep = std::max<std::int64_t>(1, p.blocked ? w.block_cols() : p.k);
  p.sb = b_scales(w, true);
  return p;
}

}  // namespace mm_detail

ScaledMmResult scaled_mm_reference(const ScaledTensorRef& a, const ScaledTensorRef& b, const ScaledMmOptions& options) {
  const mm_detail::MmPlan plan = mm_detail::plan_scaled_mm(a, b, options);
  const bool nk = options.b_layout == BLayout::kNK;
  const std::int64_t m = plan.m, n = plan.n, k = plan.k, kstep = plan.kstep;
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
        // (acc * scale_a) * scale_b + out with one rounding for the fused multiply-add: the exact order the
        // kernels use, so that they are bit-identical to this reference.
        out = std::fma(acc * plan.sa.at(i, kb), plan.sb.at(j, kb), out);
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
