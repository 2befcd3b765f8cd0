// Causal self-attention forward and backward on the CPU: one (batch, head) pair per OpenMP iteration, each pair
// gathered into contiguous (T, hs) buffers (rounded to bfloat16 when the products run in bf16) and computed in order.
#include "fp8kit/nn/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "fp8kit/common/error.hpp"
#include "fp8kit/format/half.hpp"
#include "nn_util.hpp"

namespace fp8kit::nn {
namespace {

// The sum of term(0) .. term(n - 1) in an order the source fixes, whatever the compiler: eight running sums (lane l
// takes terms l, l + 8, ...), added pairwise at the end. (Left to `omp simd reduction`, the order was the compiler's:
// GCC's and Clang's builds trained to different losses.) Compilers vectorize the eight lanes as they stand.
template <class Term>
float sum_in_lanes(std::int64_t n, Term term) {
  constexpr int kLanes = 8;
  float lane[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lane[l] += term(i + l);
  }
  for (int l = 0; i < n; ++i, ++l) lane[l] += term(i);
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

using detail::kParallelWork;
using detail::shape_string;

struct Dims {
  std::int64_t b = 0, t = 0, c = 0, h = 0, hs = 0;
};

// qkv (B, T, 3C) with C divisible by heads -> its dimensions. float32, or (a saved qkv) bfloat16 too.
Dims check_qkv(const Tensor& qkv, std::int64_t heads, DType compute, bool saved = false) {
  FP8KIT_CHECK(heads >= 1, "attention: heads must be at least 1, got ", heads);
  FP8KIT_CHECK(compute == DType::float32 || compute == DType::bfloat16,
               "attention: compute must be float32 or bfloat16, not ", name(compute));
  FP8KIT_CHECK(qkv.dtype() == DType::float32 || (saved && qkv.dtype() == DType::bfloat16), "attention: qkv must be ",
               saved ? "float32 or bfloat16" : "float32", ", got ", name(qkv.dtype()));
  FP8KIT_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0, "attention: qkv must be (B, T, 3C), got ",
               shape_string(qkv.shape()));
  Dims d{qkv.size(0), qkv.size(1), qkv.size(2) / 3, heads, 0};
  FP8KIT_CHECK(d.c % heads == 0 && d.c > 0, "attention: C = ", d.c, " (qkv ", shape_string(qkv.shape()),
               ") must be a positive multiple of heads = ", heads);
  d.hs = d.c / heads;
  return d;
}

float round_if(bool bf16, float x) {
  return bf16 ? bfloat16::from_float(x).to_float() : x;
}

float widen(float x) {
  return x;
}
float widen(bfloat16 x) {
  return x.to_float();
}

// Columns [col0, col0 + hs) of the T rows (stride `row_stride`) starting at `src` (float32, or a saved bfloat16 qkv
// widened exactly) -> dst (T, hs), rounded to bfloat16 when asked.
template <class T>
void gather(const T* src, std::int64_t rows, std::int64_t row_stride, std::int64_t col0, std::int64_t hs, bool bf16,
            float* dst) {
  for (std::int64_t t = 0; t < rows; ++t) {
    const T* s = src + t * row_stride + col0;
    for (std::int64_t i = 0; i < hs; ++i) dst[t * hs + i] = round_if(bf16, widen(s[i]));
  }
}

// Head h's q, k and v (T, hs each) from one batch element's T rows of qkv ([q | k | v], each C wide).
template <class T>
void gather_head(const T* in_b, std::int64_t rows, std::int64_t C, std::int64_t h, std::int64_t hs, bool bf16, float* q,
                 float* k, float* v) {
  gather(in_b, rows, 3 * C, h * hs, hs, bf16, q);
  gather(in_b, rows, 3 * C, C + h * hs, hs, bf16, k);
  gather(in_b, rows, 3 * C, 2 * C + h * hs, hs, bf16, v);
}

// src (T, hs) * factor -> columns [col0, col0 + hs) of the T rows (stride `row_stride`) starting at dst.
void scatter(const float* src, std::int64_t rows, std::int64_t row_stride, std::int64_t col0, std::int64_t hs,
             float factor, float* dst) {
  for (std::int64_t t = 0; t < rows; ++t) {
    float* d = dst + t * row_stride + col0;
    for (std::int64_t i = 0; i < hs; ++i) d[i] = src[t * hs + i] * factor;
  }
}

// Row t of the softmax of one (b, h) pair into row[0..t] from its q and k (T, hs): the scores, their maximum, exp
// shifted by it, the sum, the division. Returns (maximum, sum). Forward and backward's recomputation run this one
// function, so the probabilities come out bit for bit the same.
std::pair<float, float> softmax_row(const float* q, const float* k, std::int64_t t, std::int64_t hs, float scale,
                                    float* row) {
  const float* qt = q + t * hs;
  float maxval = -std::numeric_limits<float>::infinity();
  for (std::int64_t t2 = 0; t2 <= t; ++t2) {
    const float* kt = k + t2 * hs;
    const float s = sum_in_lanes(hs, [&](std::int64_t i) { return qt[i] * kt[i]; });
    row[t2] = s * scale;
    maxval = std::max(maxval, row[t2]);
  }
  // Shifted by the maximum so that exp never overflows.
  const float sum =
      sum_in_lanes(t + 1, [&](std::int64_t t2) { return row[t2] = detail::exp_approx(row[t2] - maxval); });
  for (std::int64_t t2 = 0; t2 <= t; ++t2) row[t2] /= sum;
  return {maxval, sum};
}

// Row t recomputed from its saved maximum and sum (exactly as softmax_row computed them).
void recompute_row(const float* q, const float* k, std::int64_t t, std::int64_t hs, float scale, float maxval,
                   float sum, float* row) {
  const float* qt = q + t * hs;
  for (std::int64_t t2 = 0; t2 <= t; ++t2) {
    const float* kt = k + t2 * hs;
    const float s = sum_in_lanes(hs, [&](std::int64_t i) { return qt[i] * kt[i]; });
    row[t2] = detail::exp_approx(s * scale - maxval) / sum;
  }
}

std::string describe(const Dims& d) {
  return "B=" + std::to_string(d.b) + " T=" + std::to_string(d.t) + " C=" + std::to_string(d.c) +
         " H=" + std::to_string(d.h);
}

}  // namespace

// qkv (B, T, 3C) -> out (B, T, C); saved.stats (B, H, T, 2) or saved.probs (B, H, T, T).
Tensor CausalSelfAttention::forward(const Context& ctx, const Tensor& qkv, Saved& saved) const {
  ScopedEvent event(ctx.profiler, "attention.forward");
  const Dims d = check_qkv(qkv, heads, compute);
  event.arg("shape", describe(d));
  event.arg("dtypes", std::string(name(compute)));
  const bool bf16 = compute == DType::bfloat16;
  const bool keep_probs = saves == AttentionSaves::kProbabilities;
  const std::int64_t T = d.t, C = d.c, C3 = 3 * d.c, hs = d.hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));

  Tensor out = empty({d.b, T, C}, DType::float32);
  Tensor probs = keep_probs ? empty({d.b, d.h, T, T}, DType::float32) : Tensor();
  Tensor stats = keep_probs ? Tensor() : empty({d.b, d.h, T, 2}, DType::float32);
  const float* in = qkv.data<float>();
  float* o = out.data<float>();
  float* p = keep_probs ? probs.data<float>() : nullptr;
  float* st = keep_probs ? nullptr : stats.data<float>();
  const bool parallel = static_cast<double>(d.b * d.h) * static_cast<double>(T * T * hs) >= kParallelWork;

  fp8kit::detail::RegionErrors errors;  // each head's buffers are allocations
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) if (parallel)
  for (std::int64_t bh = 0; bh < d.b * d.h; ++bh) {
    errors.guard([&] {
      const std::int64_t b = bh / d.h, h = bh % d.h;
      const float* in_b = in + b * T * C3;
      std::vector<float> q(static_cast<std::size_t>(T * hs)), k(q.size()), v(q.size()),
          acc(static_cast<std::size_t>(hs));
      std::vector<float> scratch(keep_probs ? 0 : static_cast<std::size_t>(T));
      gather_head(in_b, T, C, h, hs, bf16, q.data(), k.data(), v.data());
      for (std::int64_t t = 0; t < T; ++t) {
        float* row = keep_probs ? p + (bh * T + t) * T : scratch.data();  // p[b, h, t, :]
        const auto [maxval, sum] = softmax_row(q.data(), k.data(), t, hs, scale, row);
        if (keep_probs) {
          std::fill(row + t + 1, row + T, 0.0f);
        } else {
          st[(bh * T + t) * 2] = maxval;
          st[(bh * T + t) * 2 + 1] = sum;
        }
        // out_t = sum_t2 p[t2] v_t2.
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (std::int64_t t2 = 0; t2 <= t; ++t2) {
          const float pr = round_if(bf16, row[t2]);
          const float* vt = v.data() + t2 * hs;
          for (std::int64_t i = 0; i < hs; ++i) acc[i] += pr * vt[i];
        }
        std::copy(acc.begin(), acc.end(), o + (b * T + t) * C + h * hs);
      }
    });
  }
  errors.rethrow();

  saved.qkv = save_activation(ctx, qkv);
  saved.probs = keep_probs ? save_activation(ctx, probs) : Tensor();
  saved.stats = stats;  // float32 always: the recomputation needs the exact maximum and sum
  return out;
}

// dout (B, T, C) -> dqkv (B, T, 3C). With s = scale * q k^T, p = softmax(s), out = p v:
//   dp = dout v^T,  dv = p^T dout,  ds = p * (dp - rowsum(p * dp)),  dq = scale * ds k,  dk = scale * ds^T q.
Tensor CausalSelfAttention::backward(const Context& ctx, const Tensor& dout, const Saved& saved) const {
  ScopedEvent event(ctx.profiler, "attention.backward");
  FP8KIT_CHECK(saved.qkv.dim() == 3, "attention.backward: no saved state (call forward first)");
  // The saved qkv is read where it is (a bfloat16 one widened one head at a time): no float32 copy of all of it.
  const Tensor& qkv = saved.qkv;
  const Dims d = check_qkv(qkv, heads, compute, true);
  event.arg("shape", describe(d));
  event.arg("dtypes", std::string(name(compute)));
  const bool keep_probs = saves == AttentionSaves::kProbabilities;
  const Shape probs_shape{d.b, d.h, d.t, d.t}, stats_shape{d.b, d.h, d.t, 2};
  if (keep_probs) {
    FP8KIT_CHECK(saved.probs.shape() == probs_shape, "attention.backward: saved probabilities ",
                 shape_string(saved.probs.shape()), " do not match ", shape_string(probs_shape),
                 " (was forward run with the same heads and saves?)");
  } else {
    FP8KIT_CHECK(saved.stats.shape() == stats_shape && saved.stats.dtype() == DType::float32,
                 "attention.backward: saved statistics ", shape_string(saved.stats.shape()), " do not match ",
                 shape_string(stats_shape), " float32 (was forward run with the same heads and saves?)");
  }
  FP8KIT_CHECK(dout.dtype() == DType::float32, "attention.backward: dout must be float32, got ", name(dout.dtype()));
  const Shape out_shape{d.b, d.t, d.c};
  FP8KIT_CHECK(dout.shape() == out_shape, "attention.backward: dout ", shape_string(dout.shape()),
               " must be the output shape ", shape_string(out_shape));

  const bool bf16 = compute == DType::bfloat16;
  const std::int64_t T = d.t, C = d.c, C3 = 3 * d.c, hs = d.hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const Tensor probs = keep_probs ? load_activation(saved.probs) : Tensor();
  Tensor dqkv = empty({d.b, T, C3}, DType::float32);
  const bool saved_bf16 = qkv.dtype() == DType::bfloat16;
  const float* in = saved_bf16 ? nullptr : qkv.data<float>();
  const bfloat16* in16 = saved_bf16 ? qkv.data<bfloat16>() : nullptr;
  const float* p = keep_probs ? probs.data<float>() : nullptr;
  const float* st = keep_probs ? nullptr : saved.stats.data<float>();
  const float* dy = dout.data<float>();
  float* dx = dqkv.data<float>();
  const bool parallel = static_cast<double>(d.b * d.h) * static_cast<double>(T * T * hs) >= kParallelWork;

  fp8kit::detail::RegionErrors errors;  // each head's buffers are allocations
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) if (parallel)
  for (std::int64_t bh = 0; bh < d.b * d.h; ++bh) {
    errors.guard([&] {
      const std::int64_t b = bh / d.h, h = bh % d.h;
      const std::size_t n = static_cast<std::size_t>(T * hs);
      std::vector<float> q(n), k(n), v(n), go(n), dq(n, 0.0f), dk(n, 0.0f), dv(n, 0.0f);
      std::vector<float> dp(static_cast<std::size_t>(T)), ds(static_cast<std::size_t>(T));
      std::vector<float> scratch(keep_probs ? 0 : static_cast<std::size_t>(T));
      if (saved_bf16) {
        gather_head(in16 + b * T * C3, T, C, h, hs, bf16, q.data(), k.data(), v.data());
      } else {
        gather_head(in + b * T * C3, T, C, h, hs, bf16, q.data(), k.data(), v.data());
      }
      gather(dy + b * T * C, T, C, h * hs, hs, bf16, go.data());
      for (std::int64_t t = 0; t < T; ++t) {
        if (!keep_probs) {
          recompute_row(q.data(), k.data(), t, hs, scale, st[(bh * T + t) * 2], st[(bh * T + t) * 2 + 1],
                        scratch.data());
        }
        const float* prow = keep_probs ? p + (bh * T + t) * T : scratch.data();  // p[b, h, t, :], saved or recomputed
        const float* got = go.data() + t * hs;
        // dp[t2] = dout_t . v_t2 and dv_t2 += p[t, t2] dout_t.
        for (std::int64_t t2 = 0; t2 <= t; ++t2) {
          const float* vt = v.data() + t2 * hs;
          dp[t2] = sum_in_lanes(hs, [&](std::int64_t i) { return got[i] * vt[i]; });
          const float pr = round_if(bf16, prow[t2]);
          float* dvt = dv.data() + t2 * hs;
          for (std::int64_t i = 0; i < hs; ++i) dvt[i] += pr * got[i];
        }
        // Softmax backward in FP32: ds = p * (dp - sum p dp).
        const float dot = sum_in_lanes(t + 1, [&](std::int64_t t2) { return prow[t2] * dp[t2]; });
        for (std::int64_t t2 = 0; t2 <= t; ++t2) ds[t2] = round_if(bf16, prow[t2] * (dp[t2] - dot));
        // dq_t += ds k (scaled below) and dk_t2 += ds[t2] q_t.
        const float* qt = q.data() + t * hs;
        float* dqt = dq.data() + t * hs;
        for (std::int64_t t2 = 0; t2 <= t; ++t2) {
          const float* kt = k.data() + t2 * hs;
          float* dkt = dk.data() + t2 * hs;
          for (std::int64_t i = 0; i < hs; ++i) {
            dqt[i] += ds[t2] * kt[i];
            dkt[i] += ds[t2] * qt[i];
          }
        }
      }
      float* dx_b = dx + b * T * C3;
      scatter(dq.data(), T, C3, h * hs, hs, scale, dx_b);
      scatter(dk.data(), T, C3, C + h * hs, hs, scale, dx_b);
      scatter(dv.data(), T, C3, 2 * C + h * hs, hs, 1.0f, dx_b);
    });
  }
  errors.rethrow();
  return dqkv;
}

}  // namespace fp8kit::nn
