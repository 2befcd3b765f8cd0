// The fast scaled_mm, weight-only and float products: the dispatcher (level, operand types, shape -> kernel), the
// panel and tile loops, threads, and the epilogue (scales, bias, bfloat16 rounding, output amax). The kernels, their
// tile shapes, panel sizes and packing are in cpu/mm_*.cpp.
//
// GEMM path (Goto-style blocking, in the kernel's orientation: a left operand of R rows and a right one of C rows,
// both K long): per thread, a range of right (or left) rows; for each K panel the right panel is packed once, then
// for each block of left rows the left panel, and the micro-kernel runs over the tiles. Kernels that prefer it run
// small-M products with B as N x K as out^T = B A^T, so the big weight matrix is the left operand (decoded row by
// row) and the small activations are packed once. Unblocked scales: C holds the running FP32 sum across K panels
// and the scales are applied once at the end. Blocked scales: each K block's sum is scaled into C.
// GEMV path (M <= kGemvMaxM, or the level's gemv_max_m for left operands exact in bfloat16; weights N x K):
// threads split the weight rows in fixed chunks (the result does not depend on the thread count), each chunk taking
// the left rows kGemvRows at a time; A's rows (or the activations) are converted to FP32 (and bfloat16) once.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <vector>

#include "common/no_cuda.hpp"
#include "common/parallel.hpp"
#include "cpu/mm_kernels.hpp"
#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/convert/convert.hpp"
#include "fp8kit/ops/cuda_scaled_mm.hpp"
#include "fp8kit/ops/scaled_mm.hpp"
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

double mm_error_bound(std::int64_t k, double abs_products, double abs_exact, double max_scale, double max_operand) {
  constexpr double u = 0x1p-24;
  const double kd = static_cast<double>(std::max<std::int64_t>(k, 1));
  return (2.0 * kd + 8.0) * u * abs_products + 2.0 * u * abs_exact +
         2.0 * kd * 0x1p-126 * std::max(1.0, max_operand) * max_scale;
}

MmKernels mm_kernels() {
  const mm_detail::MmKernelTable& t = mm_detail::active_mm_kernels();
  const mm_detail::GemmKernel& gemm = t.gemm_bf16 != nullptr ? *t.gemm_bf16 : *t.gemm_f32;
  const mm_detail::GemvKernel& gemv = t.gemv(true);
  return {t.isa,
          gemm.name,
          gemv.name,
          t.gemm_f32->name,
          t.gemv_f32->name,
          gemm.contract,
          gemv.contract,
          t.gemm_f32->contract,
          t.gemv_f32->contract,
          gemm.stream_weights != nullptr ? gemm.stream_name : std::string_view{},
          gemm.stream_weights != nullptr ? gemm.stream_max_m : 0,
          t.gemv_max_m(true)};
}

namespace mm_detail {
namespace {

constexpr std::int64_t kGemvChunk = 16;  // weight rows per GEMV work item

// A kernel's per-thread state (AMX: the tile configuration) for a block of work: start() on entry, finish() when
// the block ends, an error included (RegionErrors catches it; the thread goes back to OpenMP's pool).
class KernelSession {
 public:
  explicit KernelSession(const GemmKernel& kern) : kern_(kern) {
    if (kern_.start != nullptr) kern_.start();
  }
  ~KernelSession() {
    if (kern_.finish != nullptr) kern_.finish();
  }
  KernelSession(const KernelSession&) = delete;
  KernelSession& operator=(const KernelSession&) = delete;

 private:
  const GemmKernel& kern_;
};

std::int64_t round_up(std::int64_t x, std::int64_t to) {
  return ceil_div(x, to) * to;
}

// Where element (i, j) of the kernel's output orientation lives: out + i * row_stride + j * col_stride.
struct OutView {
  float* data;
  std::int64_t row_stride, col_stride;
  float* at(std::int64_t i, std::int64_t j) const { return data + i * row_stride + j * col_stride; }
};

// The GEMM as the kernel sees it.
struct GemmProblem {
  const GemmKernel* kern;
  const Operand* left;
  const Operand* right;
  ScaleIndex s_left, s_right;
  OutView out;
  std::int64_t k = 0, kstep = 1;
  bool blocked = false;
  std::int64_t kc_max = 0;  // K per panel
};

// One tile of the output through the micro-kernel. Full tiles of a row-major view are computed in place; edge tiles
// and transposed views go through a scratch tile (read in first unless the output is still all zeros).
void run_tile(const GemmProblem& g, std::int64_t i, std::int64_t j, std::int64_t rows, std::int64_t cols,
              std::int64_t k0, std::int64_t kc_pad, std::int64_t kc, const std::byte* left, const std::byte* right) {
  const GemmKernel& kern = *g.kern;
  thread_local std::vector<float> scratch;
  const bool direct = rows == kern.mr && cols == kern.nr && g.out.col_stride == 1;
  float* c = direct ? g.out.at(i, j) : nullptr;
  std::int64_t ldc = g.out.row_stride;
  if (!direct) {
    scratch.assign(static_cast<std::size_t>(kern.mr * kern.nr), 0.0f);
    c = scratch.data();
    ldc = kern.nr;
    if (k0 > 0 || g.blocked) {
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t t = 0; t < cols; ++t) c[r * ldc + t] = *g.out.at(i + r, j + t);
    }
  }
  if (!g.blocked) {
    // The first K panel overwrites (the output is not cleared beforehand), later ones add.
    kern.accumulate(left, right, kc_pad, 0, kc, c, ldc, k0 == 0);
  } else {
    // One call per K block inside this panel (panels start on block boundaries).
    thread_local std::vector<float> s_row, s_col;
    s_row.assign(static_cast<std::size_t>(kern.mr), 0.0f);
    s_col.assign(static_cast<std::size_t>(kern.nr), 0.0f);
    for (std::int64_t off = 0; off < kc; off += g.kstep) {
      const std::int64_t len = std::min(g.kstep, kc - off);
      const std::int64_t kb = (k0 + off) / g.kstep;
      for (std::int64_t r = 0; r < rows; ++r) s_row[static_cast<std::size_t>(r)] = g.s_left.at(i + r, kb);
      for (std::int64_t t = 0; t < cols; ++t) s_col[static_cast<std::size_t>(t)] = g.s_right.at(j + t, kb);
      kern.scale_accumulate(left, right, kc_pad, off, len, c, ldc, s_row.data(), s_col.data());
    }
  }
  if (!direct) {
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t t = 0; t < cols; ++t) *g.out.at(i + r, j + t) = c[r * ldc + t];
  }
}

// Asks for the output rows of a tile [i, i + rows) x [j, j + cols) to be brought into the cache (the next tile's,
// while this one runs: see GemmKernel::prefetch_next_tile). Touches nothing (a prefetch is a hint).
void prefetch_tile(const OutView& out, std::int64_t i, std::int64_t j, std::int64_t rows, std::int64_t cols) {
  if (out.col_stride != 1) return;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = out.at(i + r, j);
    __builtin_prefetch(row, 0, 3);
    __builtin_prefetch(row + cols - 1, 0, 3);  // the same line or the next
    // GCC 12 at -O2 deletes a loop of nothing but prefetches (it has no effect the program can see); this keeps it.
    asm volatile("");
  }
}

// Output rows [i_begin, i_end) x columns [j_begin, j_end) (kernel orientation), by one thread.
void gemm_block(const GemmProblem& g, std::int64_t i_begin, std::int64_t i_end, std::int64_t j_begin,
                std::int64_t j_end) {
  const GemmKernel& kern = *g.kern;
  thread_local ScratchBuffer left_buffer, right_buffer;
  const std::int64_t kc_alloc = round_up(std::min(g.kc_max, std::max<std::int64_t>(g.k, 1)), kern.k_align);
  const auto elem = static_cast<std::int64_t>(kern.elem_bytes);
  auto* left =
      static_cast<std::byte*>(left_buffer.get(static_cast<std::size_t>(round_up(kern.mc, kern.mr) * kc_alloc * elem)));
  auto* right =
      static_cast<std::byte*>(right_buffer.get(static_cast<std::size_t>(round_up(kern.nc, kern.nr) * kc_alloc * elem)));
  const KernelSession session(kern);
  for (std::int64_t jc = j_begin; jc < j_end; jc += kern.nc) {
    const std::int64_t nc = std::min(kern.nc, j_end - jc);
    for (std::int64_t k0 = 0; k0 < g.k; k0 += g.kc_max) {
      const std::int64_t kc = std::min(g.kc_max, g.k - k0);
      const std::int64_t kc_pad = round_up(kc, kern.k_align);
      kern.pack_right(*g.right, kern.nr, jc, nc, k0, kc, right);
      for (std::int64_t ic = i_begin; ic < i_end; ic += kern.mc) {
        const std::int64_t mc = std::min(kern.mc, i_end - ic);
        kern.pack_left(*g.left, kern.mr, ic, mc, k0, kc, left);
        for (std::int64_t jr = 0; jr < nc; jr += kern.nr) {
          const std::byte* rs = right + (jr / kern.nr) * kern.nr * kc_pad * elem;
          for (std::int64_t ir = 0; ir < mc; ir += kern.mr) {
            if (kern.prefetch_next_tile) {
              // The next tile in this loop order: down the panel's rows, then the next column strip from its top.
              if (ir + kern.mr < mc) {
                prefetch_tile(g.out, ic + ir + kern.mr, jc + jr, std::min(kern.mr, mc - ir - kern.mr),
                              std::min(kern.nr, nc - jr));
              } else if (jr + kern.nr < nc) {
                prefetch_tile(g.out, ic, jc + jr + kern.nr, std::min(kern.mr, mc),
                              std::min(kern.nr, nc - jr - kern.nr));
              }
            }
            run_tile(g, ic + ir, jc + jr, std::min(kern.mr, mc - ir), std::min(kern.nr, nc - jr), k0, kc_pad, kc,
                     left + (ir / kern.mr) * kern.mr * kc_pad * elem, rs);
          }
        }
      }
    }
  }
}

// The weights-left orientation for small M (out^T = B A^T, kernels with weights_left_max_m): the few activation rows
// are packed once for all of K (one packed panel per K panel), then each thread streams its strips of weight rows:
// every strip's K panel is packed (the FP8 weights decoded) into an L1-sized buffer and multiplied with every
// activation strip into tiles kept in a scratch block for all of K, which is then written to out transposed. Each
// weight is decoded once, and the decode of one panel overlaps the tile work of the one before.
void gemm_weights_left(const GemmProblem& g, std::int64_t i_begin, std::int64_t i_end) {
  const GemmKernel& kern = *g.kern;
  const auto elem = static_cast<std::int64_t>(kern.elem_bytes);
  const std::int64_t m = g.right->rows, m_pad = round_up(m, kern.nr);
  const std::int64_t kc_pad_max = round_up(std::min(g.kc_max, std::max<std::int64_t>(g.k, 1)), kern.k_align);
  const std::int64_t panels = ceil_div(g.k, g.kc_max);
  const std::int64_t right_panel = m_pad * kc_pad_max * elem;  // bytes per packed K panel of the activations
  thread_local ScratchBuffer left_buffer, right_buffer;
  thread_local std::vector<float> block;
  auto* right = static_cast<std::byte*>(right_buffer.get(static_cast<std::size_t>(panels * right_panel)));
  auto* left = static_cast<std::byte*>(left_buffer.get(static_cast<std::size_t>(kern.mr * kc_pad_max * elem)));
  for (std::int64_t p = 0; p < panels; ++p) {
    const std::int64_t k0 = p * g.kc_max;
    kern.pack_right(*g.right, kern.nr, 0, m, k0, std::min(g.kc_max, g.k - k0), right + p * right_panel);
  }
  block.resize(static_cast<std::size_t>(kern.mr * m_pad));
  const KernelSession session(kern);
  thread_local std::vector<float> s_row, s_col;
  s_row.assign(static_cast<std::size_t>(kern.mr), 0.0f);
  s_col.assign(static_cast<std::size_t>(kern.nr), 0.0f);
  for (std::int64_t ib = i_begin; ib < i_end; ib += kern.mr) {
    const std::int64_t rows = std::min(kern.mr, i_end - ib);
    if (g.blocked) std::fill(block.begin(), block.end(), 0.0f);
    for (std::int64_t p = 0; p < panels; ++p) {
      const std::int64_t k0 = p * g.kc_max, kc = std::min(g.kc_max, g.k - k0), kc_pad = round_up(kc, kern.k_align);
      kern.pack_left(*g.left, kern.mr, ib, rows, k0, kc, left);
      for (std::int64_t jr = 0; jr < m_pad; jr += kern.nr) {
        const std::byte* rs = right + p * right_panel + (jr / kern.nr) * kern.nr * kc_pad * elem;
        float* c = block.data() + (jr / kern.nr) * kern.mr * kern.nr;
        if (!g.blocked) {
          kern.accumulate(left, rs, kc_pad, 0, kc, c, kern.nr, k0 == 0);
          continue;
        }
        const std::int64_t cols = std::min(kern.nr, m - jr);
        for (std::int64_t off = 0; off < kc; off += g.kstep) {
          const std::int64_t kb = (k0 + off) / g.kstep;
          for (std::int64_t r = 0; r < rows; ++r) s_row[static_cast<std::size_t>(r)] = g.s_left.at(ib + r, kb);
          for (std::int64_t t = 0; t < cols; ++t) s_col[static_cast<std::size_t>(t)] = g.s_right.at(jr + t, kb);
          kern.scale_accumulate(left, rs, kc_pad, off, std::min(g.kstep, kc - off), c, kern.nr, s_row.data(),
                                s_col.data());
        }
      }
    }
    // The block, transposed, into out (tile element (i, j) of activation strip s is out[jr + j][ib + i]).
    for (std::int64_t jr = 0; jr < m; jr += kern.nr) {
      const float* c = block.data() + (jr / kern.nr) * kern.mr * kern.nr;
      for (std::int64_t j = 0; j < std::min(kern.nr, m - jr); ++j)
        for (std::int64_t i = 0; i < rows; ++i) *g.out.at(ib + i, jr + j) = c[i * kern.nr + j];
    }
  }
}

// The kernel's fused small-M path (GemmKernel::stream_weights): threads split the weight rows in multiples of 16 and
// each packs the few activation rows once. False when the kernel declines (then nothing was written).
bool stream_weights(const GemmKernel& kern, const MmPlan& p, const Operand& a, const Operand& b, float* out, int used) {
  const std::int64_t k_pad = round_up(p.k, kern.k_align);
  const std::int64_t groups = ceil_div(p.n, 16);
  bool done = true;
  detail::RegionErrors errors;  // the packing buffers are allocations
#pragma omp parallel num_threads(used) reduction(&& : done)
  {
    void* x = nullptr;
    errors.guard([&] {
      thread_local ScratchBuffer x_buffer;
      x = x_buffer.get(static_cast<std::size_t>(round_up(p.m, 16) * k_pad) * kern.elem_bytes);
      kern.pack_right(a, 16, 0, p.m, 0, p.k, x);
    });
#pragma omp for schedule(static)
    for (int t = 0; t < used; ++t) {
      const std::int64_t g0 = groups * t / used, g1 = groups * (t + 1) / used;
      if (g0 < g1 && x != nullptr) {
        errors.guard(
            [&] { done = kern.stream_weights(b, 16 * g0, std::min(p.n, 16 * g1), x, p.m, k_pad, out, p.n) && done; });
      }
    }
  }
  errors.rethrow();
  return done;
}

// out (M x N) = a (M x K) times b (N x K rows, either layout): blocked products with their scales applied per K
// block, unblocked ones as raw sums (the epilogue applies their scales). Returns the name of what ran.
std::string_view gemm(const GemmKernel& kern, const MmPlan& p, const Operand& a, const Operand& b, float* out) {
  // Unblocked products overwrite the output with their first K panel; blocked ones add scaled blocks into it.
  if (p.blocked || p.k == 0) std::fill(out, out + p.m * p.n, 0.0f);
  if (p.m == 0 || p.n == 0 || p.k == 0) return kern.name;
  // (A bit-identical kernel keeps blocked products in this orientation: swapped, its tiles would scale each block's
  // sum by the weights' scale first, (sum * sb) * sa, where the reference rounds (sum * sa) * sb.)
  const bool swap = kern.weights_left_max_m > 0 && b.k_contiguous && p.m <= kern.weights_left_max_m &&
                    !(p.blocked && kern.contract == KernelContract::kBitIdentical);
  GemmProblem g;
  g.kern = &kern;
  g.left = swap ? &b : &a;
  g.right = swap ? &a : &b;
  g.s_left = swap ? p.sb : p.sa;
  g.s_right = swap ? p.sa : p.sb;
  g.out = swap ? OutView{out, 1, p.n} : OutView{out, p.n, 1};
  g.k = p.k;
  g.kstep = p.kstep;
  g.blocked = p.blocked;
  // K panels hold whole K blocks when scales are blocked (a block longer than kc is a panel of its own).
  g.kc_max = p.blocked ? p.kstep * std::max<std::int64_t>(1, kern.kc / p.kstep) : kern.kc;
  const std::int64_t rows = g.left->rows, cols = g.right->rows;
  const int threads = std::max(1, num_threads());
  const double flops = 2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k);
  const int used = flops < 4.0e6 ? 1 : threads;
  if (swap && !p.blocked && kern.stream_weights != nullptr && p.m <= kern.stream_max_m && p.k > 0 &&
      stream_weights(kern, p, a, b, out, used)) {
    return kern.stream_name;
  }
  // Split the right rows (each thread packs only its part of the right operand) when there are enough strips,
  // else the left rows; the weights-left orientation always splits the weights.
  const std::int64_t strips = ceil_div(cols, kern.nr);
  const bool split_right = !swap && (strips >= 2 * used || rows < kern.mr * used);
  detail::RegionErrors errors;  // the packing buffers are allocations
#pragma omp parallel num_threads(used)
  {
#pragma omp for schedule(static)
    for (int t = 0; t < used; ++t)
      errors.guard([&] {
        if (split_right) {
          const std::int64_t s0 = strips * t / used, s1 = strips * (t + 1) / used;
          if (s0 < s1) gemm_block(g, 0, rows, s0 * kern.nr, std::min(cols, s1 * kern.nr));
        } else {
          const std::int64_t left_strips = ceil_div(rows, kern.mr);
          const std::int64_t r0 = left_strips * t / used, r1 = left_strips * (t + 1) / used;
          if (r0 < r1 && swap) gemm_weights_left(g, r0 * kern.mr, std::min(rows, r1 * kern.mr));
          if (r0 < r1 && !swap) gemm_block(g, r0 * kern.mr, std::min(rows, r1 * kern.mr), 0, cols);
        }
      });
  }
  errors.rethrow();
  return kern.name;
}

}  // namespace

bool rebias_gemv_input(std::span<const float> x, Format weights, bool left_is_fp8, float* out, float& sum_scale) {
  // max |x| as the largest magnitude bit pattern (their integer order is the floats' order, Inf and NaN above every
  // finite one): an integer reduction with no early exit, which vectorizes where a float max does not.
  std::uint32_t top = 0;
  for (const float v : x) top = std::max(top, std::bit_cast<std::uint32_t>(v) & 0x7FFFFFFFu);
  if (top >= 0x7F800000u) return false;  // Inf or NaN
  const float xmax = std::bit_cast<float>(top);
  const int up = 127 - descriptor(weights).bias;
  // Keep max |x'| below 2^126: c = how far 2^(ilogb(xmax) + 1 + up) would pass that.
  const int c = xmax == 0.0f ? 0 : std::max(0, std::ilogb(xmax) + 1 + up - 126);
  if (c > 0 && !left_is_fp8) return false;
  const float factor = std::ldexp(1.0f, up - c);
  for (std::size_t t = 0; t < x.size(); ++t) out[t] = x[t] * factor;
  sum_scale = std::ldexp(1.0f, c);
  return true;
}

void to_gemv_lane_order(const float* x, std::int64_t m, std::int64_t k, std::int64_t kblock, int chunk, float* out) {
  const int lanes = chunk / 4;
  for (std::int64_t i = 0; i < m; ++i) {
    const float* from = x + i * k;
    float* to = out + i * k;
    for (std::int64_t k0 = 0; k0 < k; k0 += kblock) {
      const std::int64_t k1 = std::min(k, k0 + kblock);
      std::int64_t c = k0;
      for (; c + chunk <= k1; c += chunk) {
        for (int b = 0; b < 4; ++b)
          for (int l = 0; l < lanes; ++l) to[c + lanes * b + l] = from[c + 4 * l + b];
      }
      for (; c < k1; ++c) to[c] = from[c];
    }
  }
}

void left_rows_bf16(const Operand& a, std::int64_t m, std::int64_t k, const float* x, bfloat16* out) {
  FP8KIT_CHECK(a.exact_in_bf16(), "left_rows_bf16: float32 values are not exact in bfloat16");
  // Empty rows (K = 0): nothing to write, and `out` may be null (memcpy's pointers must not be, even for 0 bytes).
  if (k == 0) return;
  const auto n = static_cast<std::size_t>(k);
  for (std::int64_t i = 0; i < m; ++i) {
    bfloat16* row = out + i * k;
    if (!a.k_contiguous) {
      for (std::size_t kk = 0; kk < n; ++kk) row[kk] = bfloat16::from_float(x[i * k + static_cast<std::int64_t>(kk)]);
    } else if (a.codes != nullptr) {
      cast_from_fp8(std::span(a.codes + i * a.ld, n), a.format, std::span(row, n));
    } else {
      std::memcpy(row, a.bf16 + i * a.ld, n * sizeof(bfloat16));
    }
  }
}

namespace {

// The left rows (m x k) as float32 into x (row stride k), exactly: rows laid out along K through the conversion
// kernels (a GEMV's whole setup is this, the rebias and the lane order: at K = 8192 one value at a time through
// Operand::at took about a third of a 32-row GEMV's time with the weights in L2).
void left_rows_f32(const Operand& a, std::int64_t m, std::int64_t k, float* x) {
  for (std::int64_t i = 0; i < m; ++i) {
    float* row = x + i * k;
    const auto n = static_cast<std::size_t>(k);
    if (!a.k_contiguous) {
      for (std::int64_t kk = 0; kk < k; ++kk) row[kk] = a.at(i, kk);
    } else if (a.codes != nullptr) {
      cast_from_fp8(std::span(a.codes + i * a.ld, n), a.format, std::span(row, n));
    } else if (a.f32 != nullptr) {
      std::memcpy(row, a.f32 + i * a.ld, n * sizeof(float));
    } else {
      convert(a.bf16 + i * a.ld, DType::bfloat16, row, DType::float32, k);
    }
  }
}

// Room for count values of T from a scratch buffer, never null (for no values too: memcpy's pointers must not be).
template <class T>
T* rows_in(ScratchBuffer& buffer, std::size_t count) {
  return static_cast<T*>(buffer.get(std::max<std::size_t>(count, 1) * sizeof(T)));
}

void gemv(const GemvKernel& fast, const MmPlan& p, const Operand& a, const Operand& b, float* out) {
  // The left rows in FP32 (and bfloat16 where they are exact in it), once; rebiased when that is exact. The buffers
  // are 64-byte aligned (left uninitialized: each is written whole before it is read): the kernels load the rows a
  // vector at a time, and at malloc's 16-byte alignment each zmm load of them spanned two cache lines (Zen 5, bfloat16
  // activations, N = K = 4096, one thread: M = 3 at 55-69 GFLOP/s against 138-146 aligned; docs/gemm.md).
  const auto count = static_cast<std::size_t>(p.m * p.k);
  ScratchBuffer x_buf, bf16_buf, rebiased_buf, lanes_buf;
  auto* const x = rows_in<float>(x_buf, count);
  left_rows_f32(a, p.m, p.k, x);
  GemvInput in{x, p.k};
  if (fast.bf16_input && a.exact_in_bf16()) {
    auto* const x_bf16 = rows_in<bfloat16>(bf16_buf, count);
    left_rows_bf16(a, p.m, p.k, x, x_bf16);
    in.x_bf16 = x_bf16;
  }
  if (fast.rebiased_input) {
    auto* const x_rebiased = rows_in<float>(rebiased_buf, count);
    if (rebias_gemv_input(std::span<const float>(x, count), b.format, a.codes != nullptr, x_rebiased, in.sum_scale))
      in.rebiased = x_rebiased;
  }
  if (fast.lane_chunk != 0) {  // the fast kernel's order, where it reads another
    const float* source = in.rebiased != nullptr ? in.rebiased : in.x;
    auto* const x_lanes = rows_in<float>(lanes_buf, count);
    to_gemv_lane_order(source, p.m, p.k, p.kstep, fast.lane_chunk, x_lanes);
    (in.rebiased != nullptr ? in.rebiased : in.x) = x_lanes;
  }
  const GemvInput plain{x, p.k};
  const GemvKernel& exact = *scalar_mm_kernels().gemv_f32;  // for rows the fast kernel declines
  const std::int64_t chunks = ceil_div(p.n, kGemvChunk);
  const bool parallel = static_cast<double>(p.n) * static_cast<double>(p.k) >= detail::kParallelMmElements;
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) if (parallel)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t j0 = c * kGemvChunk, j1 = std::min(p.n, j0 + kGemvChunk);
    // The left rows kGemvRows at a time, over the same weight rows (in L1/L2 after the first group).
    for (std::int64_t i0 = 0; i0 < p.m; i0 += kGemvRows) {
      const std::int64_t rows = std::min(kGemvRows, p.m - i0);
      const std::int64_t at = i0 * p.k;
      GemvInput group = in;
      group.x += at;
      if (group.x_bf16 != nullptr) group.x_bf16 += at;
      if (group.rebiased != nullptr) group.rebiased += at;
      const GemvInput group_plain{plain.x + at, p.k};
      const ScaleIndex sa = p.sa.from_row(i0);
      float* group_out = out + i0 * p.n;
      if (!fast.run(b.format, rows, j0, j1, p.k, p.kstep, group, b.codes, sa, p.sb, group_out, p.n)) {
        exact.run(b.format, rows, j0, j1, p.k, p.kstep, group_plain, b.codes, sa, p.sb, group_out, p.n);
      }
    }
  }
}

// What the epilogue still has to do to the kernels' output.
struct Finish {
  const MmPlan* plan;
  bool scale = false;  // raw sums of an unblocked GEMM: out = fma(sum * sa, sb, 0)
  std::span<const float> bias;
  DType out_dtype = DType::float32;
};

// Scales, bias, bfloat16 rounding and the amax of the result, row by row (the level's FinishRowFn).
float epilogue(float* out, const Finish& f) {
  const MmPlan& p = *f.plan;
  const FinishRowFn finish_row = active_mm_kernels().finish_row;
  float amax = 0.0f;
  const bool parallel = static_cast<double>(p.m) * static_cast<double>(p.n) >= detail::kParallelMmElements;
  const bool scale = f.scale && p.k > 0;  // (K = 0: no K block, nothing to scale; the scales may be empty)
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) reduction(max : amax) if (parallel)
  for (std::int64_t i = 0; i < p.m; ++i) {
    const float sa = scale ? p.sa.at(i, 0) : 1.0f;
    const float row_amax = finish_row(out + i * p.n, p.n, scale ? &sa : nullptr, p.sb,
                                      f.bias.empty() ? nullptr : f.bias.data(), f.out_dtype == DType::bfloat16);
    amax = std::max(amax, row_amax);
  }
  return amax;
}

// The GEMM kernel for these operands: the level's bfloat16 kernel where both are exact in bfloat16 (and its K
// blocks fit), else its FP32 FMA kernel.
const GemmKernel& pick_gemm(const MmKernelTable& t, const MmPlan& p, const Operand& a, const Operand& b) {
  const GemmKernel* bf16 = t.gemm_bf16;
  if (bf16 != nullptr && a.exact_in_bf16() && b.exact_in_bf16() && (!p.blocked || p.kstep % bf16->k_align == 0))
    return *bf16;
  return *t.gemm_f32;
}

MmDispatch run(const MmPlan& p, const Operand& a, const Operand& b, float* out) {
  const MmKernelTable& t = active_mm_kernels();
  if (p.m <= t.gemv_max_m(a.exact_in_bf16()) && b.k_contiguous && b.codes != nullptr) {
    const GemvKernel& kern = t.gemv(a.exact_in_bf16());
    gemv(kern, p, a, b, out);
    return {MmPath::kGemv, kern.name, kern.contract, t.isa};
  }
  const GemmKernel& kern = pick_gemm(t, p, a, b);
  const std::string_view ran = gemm(kern, p, a, b, out);
  return {MmPath::kGemm, ran, kern.contract, t.isa};
}

Operand fp8_operand(const ScaledTensorRef& x, std::int64_t rows, std::int64_t k, bool k_contiguous) {
  Operand o;
  o.codes = x.data.data();
  o.format = x.format;
  o.rows = rows;
  o.k = k;
  o.ld = k_contiguous ? k : rows;
  o.k_contiguous = k_contiguous;
  return o;
}

Operand float_operand(const MatrixRef& x, std::int64_t rows, std::int64_t k, bool k_contiguous) {
  Operand o;
  if (x.dtype == DType::float32) {
    o.f32 = static_cast<const float*>(x.data);
  } else {
    o.bf16 = static_cast<const bfloat16*>(x.data);
  }
  o.rows = rows;
  o.k = k;
  o.ld = x.stride();  // x is rows x K (k_contiguous) or K x rows
  o.k_contiguous = k_contiguous;
  return o;
}

}  // namespace
}  // namespace mm_detail

float scaled_mm_into(const ScaledTensorRef& a, const ScaledTensorRef& b, std::span<float> out,
                     const ScaledMmOptions& options, MmDispatch* dispatch) {
  const mm_detail::MmPlan p = mm_detail::plan_scaled_mm(a, b, options);
  mm_detail::check_output("scaled_mm", p, out.size());
  using mm_detail::input_bytes;
  mm_detail::check_apart(
      "scaled_mm", out,
      {input_bytes("A's codes", std::span(a.data)), input_bytes("A's scales", std::span(a.scale_inv)),
       input_bytes("B's codes", std::span(b.data)), input_bytes("B's scales", std::span(b.scale_inv)),
       input_bytes("the bias", options.bias)});
  const bool nk = options.b_layout == BLayout::kNK;
  const MmDispatch taken =
      mm_detail::run(p, mm_detail::fp8_operand(a, p.m, p.k, true), mm_detail::fp8_operand(b, p.n, p.k, nk), out.data());
  if (dispatch != nullptr) *dispatch = taken;
  const bool raw_sums = taken.path == MmPath::kGemm && !p.blocked;
  return mm_detail::epilogue(out.data(), {&p, raw_sums, options.bias, options.out_dtype});
}

ScaledMmResult scaled_mm(const ScaledTensorRef& a, const ScaledTensorRef& b, const ScaledMmOptions& options) {
  const mm_detail::MmPlan p = mm_detail::plan_scaled_mm(a, b, options);
  ScaledMmResult r;
  r.m = p.m;
  r.n = p.n;
  r.out.resize(static_cast<std::size_t>(p.m * p.n));
  r.amax = scaled_mm_into(a, b, r.out, options, &r.dispatch);
  r.path = r.dispatch.path;
  return r;
}

namespace {
void check_float_operand(const char* what, const MatrixRef& x) {
  FP8KIT_CHECK(x.dtype == DType::float32 || x.dtype == DType::bfloat16, "matmul: ", what,
               " must be float32 or bfloat16, not ", name(x.dtype));
  x.check(std::string("matmul: ") + what, x.dtype);
}
}  // namespace

void matmul(MatrixRef a, MatrixRef b, BLayout b_layout, std::span<float> out, std::span<const float> bias) {
  check_float_operand("A", a);
  check_float_operand("B", b);
  const bool nk = b_layout == BLayout::kNK;
  const mm_detail::MmPlan p = mm_detail::plan_shapes("matmul", a.rows, a.cols, b.rows, b.cols, nk, bias);
  mm_detail::check_output("matmul", p, out.size());
  using mm_detail::input_bytes;
  mm_detail::check_apart("matmul", out, {input_bytes("A", a), input_bytes("B", b), input_bytes("the bias", bias)});
  // Always the FP32 FMA kernels: bit-identical to matmul_reference at every level.
  mm_detail::gemm(*mm_detail::active_mm_kernels().gemm_f32, p, mm_detail::float_operand(a, p.m, p.k, true),
                  mm_detail::float_operand(b, p.n, p.k, nk), out.data());
  mm_detail::epilogue(out.data(), {&p, true, bias, DType::float32});
}

void matmul_reference(MatrixRef a, MatrixRef b, BLayout b_layout, std::span<float> out, std::span<const float> bias) {
  check_float_operand("A", a);
  check_float_operand("B", b);
  const bool nk = b_layout == BLayout::kNK;
  const mm_detail::MmPlan p = mm_detail::plan_shapes("matmul_reference", a.rows, a.cols, b.rows, b.cols, nk, bias);
  mm_detail::check_output("matmul_reference", p, out.size());
  using mm_detail::input_bytes;
  mm_detail::check_apart("matmul_reference", out,
                         {input_bytes("A", a), input_bytes("B", b), input_bytes("the bias", bias)});
  const mm_detail::Operand left = mm_detail::float_operand(a, p.m, p.k, true);
  const mm_detail::Operand right = mm_detail::float_operand(b, p.n, p.k, nk);
  for (std::int64_t i = 0; i < p.m; ++i) {
    for (std::int64_t j = 0; j < p.n; ++j) {
      float acc = 0.0f;
      for (std::int64_t kk = 0; kk < p.k; ++kk) acc = std::fma(left.at(i, kk), right.at(j, kk), acc);
      if (!bias.empty()) acc += bias[static_cast<std::size_t>(j)];
      out[static_cast<std::size_t>(i * p.n + j)] = acc;
    }
  }
}

void fp8_weight_mm(MatrixRef x, const ScaledTensorRef& w, std::span<float> out, std::span<const float> bias,
                   MmDispatch* dispatch) {
  const mm_detail::MmPlan p = mm_detail::plan_weight_mm(x, w, bias, out.size());
  using mm_detail::input_bytes;
  mm_detail::check_apart("fp8_weight_mm", out,
                         {input_bytes("the activations", x), input_bytes("the weights' codes", std::span(w.data)),
                          input_bytes("the weights' scales", std::span(w.scale_inv)), input_bytes("the bias", bias)});
  const MmDispatch taken = mm_detail::run(p, mm_detail::float_operand(x, p.m, p.k, true),
                                          mm_detail::fp8_operand(w, p.n, p.k, true), out.data());
  if (dispatch != nullptr) *dispatch = taken;
  mm_detail::epilogue(out.data(), {&p, taken.path == MmPath::kGemm && !p.blocked, bias, DType::float32});
}

void fp8_weight_mm_reference(MatrixRef x, const ScaledTensorRef& w, std::span<float> out, std::span<const float> bias) {
  const mm_detail::MmPlan p = mm_detail::plan_weight_mm(x, w, bias, out.size());
  using mm_detail::input_bytes;
  mm_detail::check_apart("fp8_weight_mm_reference", out,
                         {input_bytes("the activations", x), input_bytes("the weights' codes", std::span(w.data)),
                          input_bytes("the weights' scales", std::span(w.scale_inv)), input_bytes("the bias", bias)});
  const mm_detail::Operand left = mm_detail::float_operand(x, p.m, p.k, true);
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

#ifndef FP8KIT_HAVE_CUDA
// The CPU-only build's device GEMM (cuda_scaled_mm.hpp): there is no device to run it on.
namespace fp8kit::cuda {
MmResult scaled_mm(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const MmOptions&) {
  detail::throw_no_cuda_backend("scaled_mm");
}
std::string cublaslt_version() {
  return "this build of fp8kit has no CUDA backend";
}
}  // namespace fp8kit::cuda
#endif
