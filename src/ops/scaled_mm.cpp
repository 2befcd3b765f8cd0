// The fast scaled_mm and weight-only products: the dispatcher, panel packing, threads and the epilogue
// (scales, bias, bfloat16 rounding, output amax). Kernels are in cpu/mm_*.cpp.
//
// GEMM path (Goto-style blocking): per thread, a range of output columns; for each K panel (kKc, a multiple of
// the K block), B's panel is decoded once into kNr-wide FP32 strips, then for each kMc rows A's panel into kMr-high
// strips, and the micro-kernel runs over the tiles. Unblocked scales: C holds the running FP32 sum across
// K panels and the scales are applied once at the end. Blocked scales: each K block's sum is scaled into C.
// GEMV path (M <= kGemvMaxM, weights N x K): threads split the weight rows in fixed chunks (the result does not
// depend on the thread count); A's rows (or the activations) are converted to FP32 once.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "fp8kit/cpu.hpp"
#include "fp8kit/error.hpp"
#include "fp8kit/scaled_mm.hpp"
#include "cpu/mm_kernels.hpp"
#include "mm_plan.hpp"

namespace fp8kit {

std::string_view name(MmPath path) {
  switch (path) {
    case MmPath::kReference:
      return "reference";
    case MmPath::kGemm:
      return "gemm";
    case MmPath::kGemv:
      return "gemv";
  }
  return "?";
}

namespace mm_detail {
namespace {

constexpr std::int64_t kKc = 256;        // K panel (A strip kMr x kKc and B strip kKc x kNr stay in L1)
constexpr std::int64_t kMc = 96;         // rows of A per panel (kMc x kKc floats: 96 KiB, in L2)
constexpr std::int64_t kNc = 4096;       // columns of B per panel (kKc x kNc floats: 4 MiB, in L3)
constexpr std::int64_t kGemvChunk = 16;  // weight rows per GEMV work item

// Where the rows of the left operand come from: FP8 codes (decoded exactly through the table) or activations.
struct LeftSource {
  const std::uint8_t* codes = nullptr;
  const DecodeTable* table = nullptr;
  const float* f32 = nullptr;
  const bfloat16* bf16 = nullptr;
  std::int64_t k = 0;  // row length

  float at(std::int64_t i, std::int64_t kk) const {
    const std::int64_t idx = i * k + kk;
    if (codes != nullptr) return (*table)[codes[idx]];
    if (f32 != nullptr) return f32[idx];
    return bf16[idx].to_float();
  }
  // Row i, columns [k0, k0 + len), as floats.
  void row(std::int64_t i, std::int64_t k0, std::int64_t len, float* dst) const {
    const std::int64_t base = i * k + k0;
    if (codes != nullptr) {
      for (std::int64_t t = 0; t < len; ++t) dst[t] = (*table)[codes[base + t]];
    } else if (f32 != nullptr) {
      std::memcpy(dst, f32 + base, static_cast<std::size_t>(len) * sizeof(float));
    } else {
      for (std::int64_t t = 0; t < len; ++t) dst[t] = bf16[base + t].to_float();
    }
  }
};

// The right operand, as N x K (weights) or K x N: FP8 codes (decoded exactly through the table) or floats.
struct RightSource {
  const std::uint8_t* codes = nullptr;
  const DecodeTable* table = nullptr;
  Format format = Format::e4m3fn;
  const float* f32 = nullptr;
  const bfloat16* bf16 = nullptr;
  bool nk = true;
  std::int64_t n = 0, k = 0;

  float at(std::int64_t idx) const {
    if (codes != nullptr) return (*table)[codes[idx]];
    if (f32 != nullptr) return f32[idx];
    return bf16[idx].to_float();
  }
};

// A's strips: dst[(strip * kc + kk) * kMr + ii] for rows [i0, i0 + rows), columns [k0, k0 + kc); zero padded.
// Written in order, reading kMr rows side by side.
void pack_a(const LeftSource& a, std::int64_t i0, std::int64_t rows, std::int64_t k0, std::int64_t kc, float* dst) {
  thread_local std::vector<float> lines;
  for (std::int64_t s = 0; s * kMr < rows; ++s) {
    float* strip = dst + s * kc * kMr;
    const std::int64_t height = std::min(kMr, rows - s * kMr);
    if (a.codes != nullptr && height == kMr) {
      const DecodeTable& t = *a.table;
      const std::uint8_t* src[kMr];
      for (std::int64_t ii = 0; ii < kMr; ++ii) src[ii] = a.codes + (i0 + s * kMr + ii) * a.k + k0;
      for (std::int64_t kk = 0; kk < kc; ++kk) {
        for (std::int64_t ii = 0; ii < kMr; ++ii) strip[kk * kMr + ii] = t[src[ii][kk]];
      }
      continue;
    }
    lines.assign(static_cast<std::size_t>(kMr * kc), 0.0f);
    for (std::int64_t ii = 0; ii < height; ++ii) a.row(i0 + s * kMr + ii, k0, kc, lines.data() + ii * kc);
    for (std::int64_t kk = 0; kk < kc; ++kk) {
      for (std::int64_t ii = 0; ii < kMr; ++ii) strip[kk * kMr + ii] = lines[static_cast<std::size_t>(ii * kc + kk)];
    }
  }
}

// B's strips: dst[(strip * kc + kk) * kNr + jj] for columns [j0, j0 + cols), K rows [k0, k0 + kc); zero padded.
// Written in order (as N x K, reading kNr weight rows side by side).
void pack_b(const RightSource& b, std::int64_t j0, std::int64_t cols, std::int64_t k0, std::int64_t kc, float* dst) {
  for (std::int64_t s = 0; s * kNr < cols; ++s) {
    float* strip = dst + s * kc * kNr;
    const std::int64_t width = std::min(kNr, cols - s * kNr);
    if (b.nk) {
      std::int64_t base[kNr] = {};
      for (std::int64_t jj = 0; jj < width; ++jj) base[jj] = (j0 + s * kNr + jj) * b.k + k0;
      for (std::int64_t kk = 0; kk < kc; ++kk) {
        float* d = strip + kk * kNr;
        if (b.codes != nullptr) {
          for (std::int64_t jj = 0; jj < width; ++jj) d[jj] = (*b.table)[b.codes[base[jj] + kk]];
        } else {
          for (std::int64_t jj = 0; jj < width; ++jj) d[jj] = b.at(base[jj] + kk);
        }
        for (std::int64_t jj = width; jj < kNr; ++jj) d[jj] = 0.0f;
      }
    } else {
      for (std::int64_t kk = 0; kk < kc; ++kk) {
        const std::int64_t base = (k0 + kk) * b.n + j0 + s * kNr;
        float* d = strip + kk * kNr;
        for (std::int64_t jj = 0; jj < width; ++jj) d[jj] = b.at(base + jj);
        for (std::int64_t jj = width; jj < kNr; ++jj) d[jj] = 0.0f;
      }
    }
  }
}

// One tile of C through the micro-kernel; edge tiles go through a full-size scratch tile.
void run_tile(const MmKernelTable& kern, const MmPlan& p, std::int64_t i, std::int64_t j, std::int64_t rows,
              std::int64_t cols, std::int64_t k0, std::int64_t kc, const float* a, const float* b, float* out) {
  float scratch[kMr * kNr];
  const bool full = rows == kMr && cols == kNr;
  float* c = full ? out + i * p.n + j : scratch;
  const std::int64_t ldc = full ? p.n : kNr;
  if (!full) {
    std::fill(scratch, scratch + kMr * kNr, 0.0f);
    for (std::int64_t r = 0; r < rows; ++r) std::copy_n(out + (i + r) * p.n + j, cols, scratch + r * kNr);
  }
  if (!p.blocked) {
    kern.accumulate(kc, a, b, c, ldc);
  } else {
    // One call per K block inside this panel (panels start on block boundaries).
    for (std::int64_t off = 0; off < kc; off += p.kstep) {
      const std::int64_t len = std::min(p.kstep, kc - off);
      const std::int64_t kb = (k0 + off) / p.kstep;
      float sa[kMr], sb[kNr];
      for (std::int64_t r = 0; r < kMr; ++r) sa[r] = r < rows ? p.sa.at(i + r, kb) : 0.0f;
      for (std::int64_t t = 0; t < kNr; ++t) sb[t] = t < cols ? p.sb.at(j + t, kb) : 0.0f;
      kern.scale_accumulate(len, a + off * kMr, b + off * kNr, c, ldc, sa, sb);
    }
  }
  if (!full) {
    for (std::int64_t r = 0; r < rows; ++r) std::copy_n(scratch + r * kNr, cols, out + (i + r) * p.n + j);
  }
}

// C[:, j_begin:j_end) for all rows, by one thread.
void gemm_columns(const MmKernelTable& kern, const MmPlan& p, const LeftSource& a, const RightSource& b,
                  std::int64_t j_begin, std::int64_t j_end, std::int64_t i_begin, std::int64_t i_end, float* out) {
  // K panels hold whole K blocks when scales are blocked (a block longer than kKc is a panel of its own).
  const std::int64_t kc_max = p.blocked ? p.kstep * std::max<std::int64_t>(1, kKc / p.kstep) : kKc;
  thread_local std::vector<float> apack, bpack;
  const std::int64_t kc_alloc = std::min(kc_max, std::max<std::int64_t>(p.k, 1));
  apack.resize(static_cast<std::size_t>(ceil_div(kMc, kMr) * kMr * kc_alloc));
  bpack.resize(static_cast<std::size_t>(ceil_div(kNc, kNr) * kNr * kc_alloc));
  for (std::int64_t jc = j_begin; jc < j_end; jc += kNc) {
    const std::int64_t nc = std::min(kNc, j_end - jc);
    for (std::int64_t k0 = 0; k0 < p.k; k0 += kc_max) {
      const std::int64_t kc = std::min(kc_max, p.k - k0);
      pack_b(b, jc, nc, k0, kc, bpack.data());
      for (std::int64_t ic = i_begin; ic < i_end; ic += kMc) {
        const std::int64_t mc = std::min(kMc, i_end - ic);
        pack_a(a, ic, mc, k0, kc, apack.data());
        for (std::int64_t jr = 0; jr < nc; jr += kNr) {
          const float* bs = bpack.data() + (jr / kNr) * kc * kNr;
          for (std::int64_t ir = 0; ir < mc; ir += kMr) {
            run_tile(kern, p, ic + ir, jc + jr, std::min(kMr, mc - ir), std::min(kNr, nc - jr), k0, kc,
                     apack.data() + (ir / kMr) * kc * kMr, bs, out);
          }
        }
      }
    }
  }
}

void gemm(const MmPlan& p, const LeftSource& a, const RightSource& b, float* out) {
  const MmKernelTable& kern = active_mm_kernels();
  std::fill(out, out + p.m * p.n, 0.0f);
  if (p.m == 0 || p.n == 0) return;
  const int threads = std::max(1, num_threads());
  const double flops = 2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k);
  const int used = flops < 4.0e6 ? 1 : threads;
  // Split the columns (each thread decodes only its part of B) when there are enough strips, else the rows.
  const std::int64_t strips = ceil_div(p.n, kNr);
  const bool split_columns = strips >= 2 * used || p.m < kMr * used;
#pragma omp parallel num_threads(used)
  {
#pragma omp for schedule(static)
    for (int t = 0; t < used; ++t) {
      if (split_columns) {
        const std::int64_t s0 = strips * t / used, s1 = strips * (t + 1) / used;
        if (s0 < s1) gemm_columns(kern, p, a, b, s0 * kNr, std::min(p.n, s1 * kNr), 0, p.m, out);
      } else {
        const std::int64_t rows = ceil_div(p.m, kMr);
        const std::int64_t r0 = rows * t / used, r1 = rows * (t + 1) / used;
        if (r0 < r1) gemm_columns(kern, p, a, b, 0, p.n, r0 * kMr, std::min(p.m, r1 * kMr), out);
      }
    }
    if (!p.blocked && p.k > 0) {
      // The whole K was one block: out = fma(sum * sa, sb, 0), as the reference.
#pragma omp for schedule(static)
      for (std::int64_t i = 0; i < p.m; ++i) kern.scale_row(out + i * p.n, p.n, p.sa.at(i, 0), p.sb);
    }
  }
}

// The rebiased activations of a GEMV (see GemvInput), or false when they cannot be made exact: x * 2^(127 - bias -
// c) must be finite (c > 0 only for FP8 left operands, whose products with FP8 weights stay far above the float
// subnormals after the 2^-c, so the kernel's sums are the unscaled ones times 2^-c exactly).
bool rebias(const std::vector<float>& x, Format weights, bool left_is_fp8, std::vector<float>& out, float& sum_scale) {
  float xmax = 0.0f;
  for (float v : x) {
    if (!std::isfinite(v)) return false;
    xmax = std::max(xmax, std::fabs(v));
  }
  const int up = 127 - descriptor(weights).bias;
  // Keep max |x'| below 2^126: c = how far 2^(ilogb(xmax) + 1 + up) would pass that.
  const int c = xmax == 0.0f ? 0 : std::max(0, std::ilogb(xmax) + 1 + up - 126);
  if (c > 0 && !left_is_fp8) return false;
  out.resize(x.size());
  const float factor = std::ldexp(1.0f, up - c);
  for (std::size_t t = 0; t < x.size(); ++t) out[t] = x[t] * factor;
  sum_scale = std::ldexp(1.0f, c);
  return true;
}

void gemv(const MmPlan& p, const LeftSource& a, const RightSource& b, float* out) {
  // The left rows in FP32, once (and rebiased when that is exact).
  std::vector<float> x(static_cast<std::size_t>(p.m * p.k)), x_rebiased;
  for (std::int64_t i = 0; i < p.m; ++i) a.row(i, 0, p.k, x.data() + i * p.k);
  GemvInput in{x.data(), p.k};
  if (rebias(x, b.format, a.codes != nullptr, x_rebiased, in.sum_scale)) in.rebiased = x_rebiased.data();
  const GemvInput plain{x.data(), p.k};
  const MmKernelTable& fast = active_mm_kernels();  // declines rows it cannot decode exactly (and under DAZ)
  const MmKernelTable& exact = scalar_mm_kernels();
  const std::int64_t chunks = ceil_div(p.n, kGemvChunk);
  const bool parallel = static_cast<double>(p.n) * static_cast<double>(p.k) >= 1.0e6;
#pragma omp parallel for schedule(static) if (parallel)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t j0 = c * kGemvChunk, j1 = std::min(p.n, j0 + kGemvChunk);
    if (!fast.gemv(b.format, p.m, j0, j1, p.k, p.kstep, in, b.codes, p.sa, p.sb, out, p.n)) {
      exact.gemv(b.format, p.m, j0, j1, p.k, p.kstep, plain, b.codes, p.sa, p.sb, out, p.n);
    }
  }
}

// Bias, bfloat16 rounding and the amax of the result.
float epilogue(float* out, std::int64_t m, std::int64_t n, std::span<const float> bias, DType out_dtype) {
  float amax = 0.0f;
  const bool parallel = static_cast<double>(m) * static_cast<double>(n) >= 1.0e6;
#pragma omp parallel for schedule(static) reduction(max : amax) if (parallel)
  for (std::int64_t i = 0; i < m; ++i) {
    float* row = out + i * n;
    for (std::int64_t j = 0; j < n; ++j) {
      float v = row[j];
      if (!bias.empty()) v += bias[static_cast<std::size_t>(j)];
      if (out_dtype == DType::bfloat16) v = bfloat16::from_float(v).to_float();
      row[j] = v;
      if (std::isfinite(v)) amax = std::max(amax, std::fabs(v));
    }
  }
  return amax;
}

MmPath run(const MmPlan& p, const LeftSource& a, const RightSource& b, float* out) {
  if (p.m <= kGemvMaxM && b.nk) {
    gemv(p, a, b, out);
    return MmPath::kGemv;
  }
  gemm(p, a, b, out);
  return MmPath::kGemm;
}

RightSource right_source(const ScaledMatrix& b, bool nk, const MmPlan& p) {
  RightSource r;
  r.codes = b.data.data();
  r.table = &decode_table(b.format);
  r.format = b.format;
  r.nk = nk;
  r.n = p.n;
  r.k = p.k;
  return r;
}

}  // namespace
}  // namespace mm_detail

float scaled_mm_into(const ScaledMatrix& a, const ScaledMatrix& b, std::span<float> out, const ScaledMmOptions& options,
                     MmPath* path) {
  const mm_detail::MmPlan p = mm_detail::plan_scaled_mm(a, b, options);
  mm_detail::check_output("scaled_mm", p, out.size());
  mm_detail::LeftSource left;
  left.codes = a.data.data();
  left.table = &mm_detail::decode_table(a.format);
  left.k = p.k;
  const MmPath taken =
      mm_detail::run(p, left, mm_detail::right_source(b, options.b_layout == BLayout::kNK, p), out.data());
  if (path != nullptr) *path = taken;
  return mm_detail::epilogue(out.data(), p.m, p.n, options.bias, options.out_dtype);
}

ScaledMmResult scaled_mm(const ScaledMatrix& a, const ScaledMatrix& b, const ScaledMmOptions& options) {
  const mm_detail::MmPlan p = mm_detail::plan_scaled_mm(a, b, options);
  ScaledMmResult r;
  r.m = p.m;
  r.n = p.n;
  r.out.resize(static_cast<std::size_t>(p.m * p.n));
  r.amax = scaled_mm_into(a, b, r.out, options, &r.path);
  return r;
}

namespace {
mm_detail::LeftSource activation_source(const ActivationView& x) {
  mm_detail::LeftSource left;
  left.k = x.cols;
  if (x.dtype == DType::float32) {
    left.f32 = static_cast<const float*>(x.data);
  } else {
    left.bf16 = static_cast<const bfloat16*>(x.data);
  }
  return left;
}

void check_float_operand(const char* what, const ActivationView& x) {
  FP8KIT_CHECK(x.dtype == DType::float32 || x.dtype == DType::bfloat16, "matmul: ", what,
               " must be float32 or bfloat16, not ", name(x.dtype));
  FP8KIT_CHECK(x.rows >= 0 && x.cols >= 0 && (x.data != nullptr || x.rows * x.cols == 0), "matmul: ", what, " ", x.rows,
               "x", x.cols, " without data");
}
}  // namespace

void matmul(ActivationView a, ActivationView b, BLayout b_layout, std::span<float> out, std::span<const float> bias) {
  check_float_operand("A", a);
  check_float_operand("B", b);
  const bool nk = b_layout == BLayout::kNK;
  const mm_detail::MmPlan p = mm_detail::plan_shapes("matmul", a.rows, a.cols, b.rows, b.cols, nk, bias);
  mm_detail::check_output("matmul", p, out.size());
  mm_detail::RightSource right;
  right.f32 = b.dtype == DType::float32 ? static_cast<const float*>(b.data) : nullptr;
  right.bf16 = b.dtype == DType::bfloat16 ? static_cast<const bfloat16*>(b.data) : nullptr;
  right.nk = nk;
  right.n = p.n;
  right.k = p.k;
  mm_detail::gemm(p, activation_source(a), right, out.data());
  mm_detail::epilogue(out.data(), p.m, p.n, bias, DType::float32);
}

void matmul_reference(ActivationView a, ActivationView b, BLayout b_layout, std::span<float> out,
                      std::span<const float> bias) {
  check_float_operand("A", a);
  check_float_operand("B", b);
  const bool nk = b_layout == BLayout::kNK;
  const mm_detail::MmPlan p = mm_detail::plan_shapes("matmul_reference", a.rows, a.cols, b.rows, b.cols, nk, bias);
  mm_detail::check_output("matmul_reference", p, out.size());
  const std::int64_t m = p.m, k = p.k, n = p.n;
  const mm_detail::LeftSource left = activation_source(a), right = activation_source(b);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (std::int64_t kk = 0; kk < k; ++kk)
        acc = std::fma(left.at(i, kk), nk ? right.at(j, kk) : right.at(kk, j), acc);
      if (!bias.empty()) acc += bias[static_cast<std::size_t>(j)];
      out[static_cast<std::size_t>(i * n + j)] = acc;
    }
  }
}

void fp8_weight_mm(ActivationView x, const ScaledMatrix& w, std::span<float> out, std::span<const float> bias,
                   MmPath* path) {
  const mm_detail::MmPlan p = mm_detail::plan_weight_mm(x, w, bias, out.size());
  const MmPath taken = mm_detail::run(p, activation_source(x), mm_detail::right_source(w, true, p), out.data());
  if (path != nullptr) *path = taken;
  mm_detail::epilogue(out.data(), p.m, p.n, bias, DType::float32);
}

void fp8_weight_mm_reference(ActivationView x, const ScaledMatrix& w, std::span<float> out,
                             std::span<const float> bias) {
  const mm_detail::MmPlan p = mm_detail::plan_weight_mm(x, w, bias, out.size());
  const mm_detail::LeftSource left = activation_source(x);
  for (std::int64_t i = 0; i < p.m; ++i) {
    for (std::int64_t j = 0; j < p.n; ++j) {
      float total = 0.0f;
      for (std::int64_t k0 = 0, kb = 0; k0 < p.k; k0 += p.kstep, ++kb) {
        float acc = 0.0f;
        for (std::int64_t kk = k0; kk < std::min(p.k, k0 + p.kstep); ++kk) {
          acc =
              std::fma(left.at(i, kk), decode_to_float(w.format, w.data[static_cast<std::size_t>(j * p.k + kk)]), acc);
        }
        total = std::fma(acc * p.sa.at(i, kb), p.sb.at(j, kb), total);
      }
      if (!bias.empty()) total += bias[static_cast<std::size_t>(j)];
      out[static_cast<std::size_t>(i * p.n + j)] = total;
    }
  }
}

}  // namespace fp8kit
