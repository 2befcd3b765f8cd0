// Causal self-attention: forward against a double-precision reference, gradients against finite differences, the
// causal mask, bf16 products (close to FP32, bit-identical to a reference rounding the same way), threads, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "common/same_bits.hpp"
#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/format/half.hpp"
#include "fp8kit/nn/attention.hpp"

#include "nn_test_util.hpp"

namespace fp8kit::nn {
namespace {

using testing::central_difference;

struct AttentionCase {
  std::int64_t b, t, c, h;
};

Tensor random_qkv(const AttentionCase& k, std::uint64_t seed, double stddev = 1.0) {
  Tensor x = randn({k.b, k.t, 3 * k.c}, seed, DType::float32);
  for (float& v : x.span<float>()) v = static_cast<float>(v * stddev);
  return x;
}

// ||a - b|| / ||b|| over all elements, in double.
double relative_error(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double d = a.item_as_double(i) - b.item_as_double(i);
    num += d * d;
    den += b.item_as_double(i) * b.item_as_double(i);
  }
  return std::sqrt(num / den);
}

// out (B, T, C) of qkv in double, straight from the definition.
std::vector<double> reference_forward(const Tensor& qkv, std::int64_t heads) {
  const std::int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, hs = C / heads;
  const float* x = qkv.data<float>();
  auto at = [&](std::int64_t b, std::int64_t t, std::int64_t col) { return double{x[(b * T + t) * 3 * C + col]}; };
  std::vector<double> out(static_cast<std::size_t>(B * T * C));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t t = 0; t < T; ++t) {
        std::vector<double> e(static_cast<std::size_t>(t + 1));
        double m = -std::numeric_limits<double>::infinity(), sum = 0;
        for (std::int64_t t2 = 0; t2 <= t; ++t2) {
          double s = 0;
          for (std::int64_t i = 0; i < hs; ++i) s += at(b, t, h * hs + i) * at(b, t2, C + h * hs + i);
          e[t2] = s / std::sqrt(static_cast<double>(hs));
          m = std::max(m, e[t2]);
        }
        for (std::int64_t t2 = 0; t2 <= t; ++t2) sum += (e[t2] = std::exp(e[t2] - m));
        for (std::int64_t i = 0; i < hs; ++i) {
          double o = 0;
          for (std::int64_t t2 = 0; t2 <= t; ++t2) o += e[t2] / sum * at(b, t2, 2 * C + h * hs + i);
          out[(b * T + t) * C + h * hs + i] = o;
        }
      }
  return out;
}

float bf(float x) {
  return bfloat16::from_float(x).to_float();
}

// The bf16-compute attention written out directly on (b, h, t, t2, i) indices: every product operand rounded to
// bfloat16, FP32 accumulation in the order the library documents (sums over t2, then i, ascending; dv and dk sum
// over t ascending), the scale applied after the product. Fills out (B, T, C) and dqkv (B, T, 3C).
void reference_bf16(const Tensor& qkv, const Tensor& dout, std::int64_t heads, std::vector<float>& out,
                    std::vector<float>& dqkv) {
  const std::int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, C3 = 3 * C, hs = C / heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const float* x = qkv.data<float>();
  const float* g = dout.data<float>();
  out.assign(static_cast<std::size_t>(B * T * C), 0.0f);
  dqkv.assign(static_cast<std::size_t>(B * T * C3), 0.0f);
  auto q = [&](std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t i) {
    return bf(x[(b * T + t) * C3 + h * hs + i]);
  };
  auto k = [&](std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t i) {
    return bf(x[(b * T + t) * C3 + C + h * hs + i]);
  };
  auto v = [&](std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t i) {
    return bf(x[(b * T + t) * C3 + 2 * C + h * hs + i]);
  };
  auto go = [&](std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t i) {
    return bf(g[(b * T + t) * C + h * hs + i]);
  };
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < heads; ++h) {
      std::vector<float> P(static_cast<std::size_t>(T * T), 0.0f), dS(P.size(), 0.0f), dp(static_cast<std::size_t>(T));
      for (std::int64_t t = 0; t < T; ++t) {
        float m = -std::numeric_limits<float>::infinity();
        for (std::int64_t t2 = 0; t2 <= t; ++t2) {
          float s = 0.0f;
          for (std::int64_t i = 0; i < hs; ++i) s += q(b, t, h, i) * k(b, t2, h, i);
          P[t * T + t2] = s * scale;
          m = std::max(m, P[t * T + t2]);
        }
        float sum = 0.0f;
        for (std::int64_t t2 = 0; t2 <= t; ++t2) sum += (P[t * T + t2] = std::exp(P[t * T + t2] - m));
        for (std::int64_t t2 = 0; t2 <= t; ++t2) P[t * T + t2] /= sum;
        for (std::int64_t i = 0; i < hs; ++i) {
          float o = 0.0f;
          for (std::int64_t t2 = 0; t2 <= t; ++t2) o += bf(P[t * T + t2]) * v(b, t2, h, i);
          out[(b * T + t) * C + h * hs + i] = o;
        }
        // dp = dout v^T, ds = p (dp - sum p dp), rounded.
        for (std::int64_t t2 = 0; t2 <= t; ++t2) {
          float s = 0.0f;
          for (std::int64_t i = 0; i < hs; ++i) s += go(b, t, h, i) * v(b, t2, h, i);
          dp[t2] = s;
        }
        float dot = 0.0f;
        for (std::int64_t t2 = 0; t2 <= t; ++t2) dot += P[t * T + t2] * dp[t2];
        for (std::int64_t t2 = 0; t2 <= t; ++t2) dS[t * T + t2] = bf(P[t * T + t2] * (dp[t2] - dot));
      }
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t i = 0; i < hs; ++i) {
          float dq = 0.0f, dk = 0.0f, dv = 0.0f;
          for (std::int64_t t2 = 0; t2 <= t; ++t2) dq += dS[t * T + t2] * k(b, t2, h, i);
          for (std::int64_t t1 = t; t1 < T; ++t1) {
            dk += dS[t1 * T + t] * q(b, t1, h, i);
            dv += bf(P[t1 * T + t]) * go(b, t1, h, i);
          }
          float* row = dqkv.data() + (b * T + t) * C3 + h * hs + i;
          row[0] = dq * scale;
          row[C] = dk * scale;
          row[2 * C] = dv;
        }
    }
}

// L(qkv) = sum(w * attention(qkv)), summed in double.
double loss(const CausalSelfAttention& attn, const Tensor& qkv, const Tensor& w) {
  CausalSelfAttention::Saved saved;
  const Tensor y = attn.forward(Context{}, qkv, saved);
  double l = 0;
  for (std::int64_t i = 0; i < y.numel(); ++i) l += double{y.data<float>()[i]} * w.data<float>()[i];
  return l;
}

// Finite-difference agreement. The layer runs in FP32, so a central difference (L(x+e) - L(x-e)) / 2e carries a
// truncation error ~ e^2/6 |L'''| and a rounding error ~ 2^-24 |L| sqrt(n) / e. With inputs ~ N(0, 1), e = 1e-2
// and |L| = O(1) both are ~1e-4; 2e-3 absolute plus 1e-2 relative leaves a wide margin, while a wrong term in the
// backward (a missing softmax correction, a transposed product, a wrong scale) is off by O(|grad|).
bool fd_agrees(double fd, double analytic) {
  return std::fabs(fd - analytic) <= 2e-3 + 1e-2 * std::fabs(analytic);
}

TEST(Attention, ForwardMatchesDoubleReference) {
  for (const AttentionCase k : {AttentionCase{2, 7, 12, 3}, AttentionCase{1, 1, 4, 1}, AttentionCase{3, 17, 8, 2},
                                AttentionCase{1, 33, 16, 4}, AttentionCase{2, 0, 4, 2}}) {
    const CausalSelfAttention attn{k.h, DType::float32, AttentionSaves::kProbabilities};
    const Tensor qkv = random_qkv(k, 11);
    CausalSelfAttention::Saved saved;
    const Tensor y = attn.forward(Context{}, qkv, saved);
    EXPECT_EQ(saved.stats.numel(), 0);  // the probabilities instead
    ASSERT_EQ(y.shape(), (Shape{k.b, k.t, k.c}));
    const std::vector<double> want = reference_forward(qkv, k.h);
    for (std::int64_t i = 0; i < y.numel(); ++i) {
      EXPECT_NEAR(y.data<float>()[i], want[i], 1e-5 * (1.0 + std::fabs(want[i]))) << "T=" << k.t << " i=" << i;
    }
    // The saved probabilities: rows sum to 1, zero above the diagonal.
    ASSERT_EQ(saved.probs.shape(), (Shape{k.b, k.h, k.t, k.t}));
    const float* p = saved.probs.data<float>();
    for (std::int64_t r = 0; r < k.b * k.h * k.t; ++r) {
      const std::int64_t t = r % k.t;
      double sum = 0;
      for (std::int64_t t2 = 0; t2 < k.t; ++t2) {
        if (t2 > t) EXPECT_EQ(p[r * k.t + t2], 0.0f);
        sum += p[r * k.t + t2];
      }
      EXPECT_NEAR(sum, 1.0, 1e-6);
    }
  }
}

TEST(Attention, LargeScoresStayFinite) {
  // Scores of several hundred: without the max shift exp would overflow float to Inf, and p = Inf / Inf is NaN.
  const AttentionCase k{1, 9, 8, 2};
  const Tensor qkv = random_qkv(k, 5, 20.0);
  CausalSelfAttention::Saved saved;
  const Tensor y = CausalSelfAttention{k.h}.forward(Context{}, qkv, saved);
  const std::vector<double> want = reference_forward(qkv, k.h);
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    ASSERT_TRUE(std::isfinite(y.data<float>()[i]));
    // Scores ~1e2-1e3 carry absolute float errors ~1e-4, which move the probabilities by as much.
    EXPECT_NEAR(y.data<float>()[i], want[i], 1e-3 * (1.0 + std::fabs(want[i])));
  }
}

TEST(Attention, GradientsMatchFiniteDifferences) {
  for (const AttentionCase k : {AttentionCase{2, 5, 8, 2}, AttentionCase{1, 4, 6, 1}}) {
    const CausalSelfAttention attn{k.h};
    Tensor qkv = random_qkv(k, 21);
    const Tensor w = randn({k.b, k.t, k.c}, 22, DType::float32);  // dL/dout
    CausalSelfAttention::Saved saved;
    attn.forward(Context{}, qkv, saved);
    const Tensor dqkv = attn.backward(Context{}, w, saved);
    ASSERT_EQ(dqkv.shape(), qkv.shape());
    const float e = 1e-2f;
    float* x = qkv.data<float>();
    for (std::int64_t i = 0; i < qkv.numel(); ++i) {
      const double fd = central_difference(x + i, e, [&] { return loss(attn, qkv, w); });
      EXPECT_PRED2(fd_agrees, fd, dqkv.data<float>()[i]) << "element " << i << " of qkv, T=" << k.t;
    }
  }
}

TEST(Attention, CausalMaskHidesLaterTokens) {
  const AttentionCase k{2, 8, 8, 2};
  const CausalSelfAttention attn{k.h};
  const Tensor qkv = random_qkv(k, 31);
  CausalSelfAttention::Saved saved;
  const Tensor y = attn.forward(Context{}, qkv, saved);
  for (std::int64_t t0 = 0; t0 + 1 < k.t; ++t0) {
    // Change q, k and v of every token after t0: outputs at t <= t0 must not move by a single bit.
    Tensor changed = qkv.clone();
    float* x = changed.data<float>();
    for (std::int64_t b = 0; b < k.b; ++b)
      for (std::int64_t t = t0 + 1; t < k.t; ++t)
        for (std::int64_t j = 0; j < 3 * k.c; ++j) x[(b * k.t + t) * 3 * k.c + j] += 5.0f;
    CausalSelfAttention::Saved s2;
    const Tensor y2 = attn.forward(Context{}, changed, s2);
    for (std::int64_t b = 0; b < k.b; ++b)
      for (std::int64_t t = 0; t < k.t; ++t)
        for (std::int64_t j = 0; j < k.c; ++j) {
          const std::int64_t i = (b * k.t + t) * k.c + j;
          if (t <= t0) {
            EXPECT_EQ(y.data<float>()[i], y2.data<float>()[i]) << "t0=" << t0 << " t=" << t;
          }
        }
    // And later tokens do change (the perturbation is seen where it should be).
    EXPECT_NE(y.data<float>()[((k.t - 1) * k.c)], y2.data<float>()[((k.t - 1) * k.c)]);
  }
}

TEST(Attention, Bf16ComputeIsCloseToFp32) {
  const AttentionCase k{2, 16, 16, 2};
  const Tensor qkv = random_qkv(k, 41);
  const Tensor dout = randn({k.b, k.t, k.c}, 42, DType::float32);
  CausalSelfAttention::Saved s32, s16;
  const CausalSelfAttention fp32{k.h, DType::float32}, bf16{k.h, DType::bfloat16};
  const Tensor y32 = fp32.forward(Context{}, qkv, s32), y16 = bf16.forward(Context{}, qkv, s16);
  const Tensor d32 = fp32.backward(Context{}, dout, s32), d16 = bf16.backward(Context{}, dout, s16);
  // bf16 keeps 8 significant bits (relative rounding 2^-9 ~ 2e-3 per operand): about 1e-2 after the products.
  EXPECT_LT(relative_error(y16, y32), 1e-2);
  EXPECT_LT(relative_error(d16, d32), 2e-2);
  EXPECT_GT(relative_error(y16, y32), 0.0);  // the rounding did happen
}

TEST(Attention, Bf16ComputeIsBitIdenticalToRoundingReference) {
  for (const AttentionCase k : {AttentionCase{2, 9, 12, 3}, AttentionCase{1, 17, 8, 1}}) {
    const Tensor qkv = random_qkv(k, 51);
    const Tensor dout = randn({k.b, k.t, k.c}, 52, DType::float32);
    const CausalSelfAttention attn{k.h, DType::bfloat16};
    CausalSelfAttention::Saved saved;
    const Tensor y = attn.forward(Context{}, qkv, saved);
    const Tensor dqkv = attn.backward(Context{}, dout, saved);
    std::vector<float> want_y, want_d;
    reference_bf16(qkv, dout, k.h, want_y, want_d);
    for (std::int64_t i = 0; i < y.numel(); ++i) {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(y.data<float>()[i]), std::bit_cast<std::uint32_t>(want_y[i]))
          << "out element " << i;
    }
    for (std::int64_t i = 0; i < dqkv.numel(); ++i) {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(dqkv.data<float>()[i]), std::bit_cast<std::uint32_t>(want_d[i]))
          << "dqkv element " << i;
    }
  }
}

TEST(Attention, SavedInBf16HalvesMemoryAndStaysClose) {
  const AttentionCase k{2, 8, 8, 2};
  const CausalSelfAttention attn{k.h, DType::float32, AttentionSaves::kProbabilities};
  const Tensor qkv = random_qkv(k, 61);
  const Tensor dout = randn({k.b, k.t, k.c}, 62, DType::float32);
  Context ctx32, ctx16;
  ctx16.saved_dtype = DType::bfloat16;
  CausalSelfAttention::Saved s32, s16;
  const Tensor y32 = attn.forward(ctx32, qkv, s32), y16 = attn.forward(ctx16, qkv, s16);
  EXPECT_TRUE(fp8kit::testing::same_bits(y32, y16));  // saving does not change the forward
  EXPECT_EQ(s16.qkv.dtype(), DType::bfloat16);
  EXPECT_EQ(s16.probs.dtype(), DType::bfloat16);
  EXPECT_TRUE(s32.qkv.shares_storage_with(qkv));  // float32: the input itself, no copy
  const Tensor d32 = attn.backward(ctx32, dout, s32), d16 = attn.backward(ctx16, dout, s16);
  EXPECT_LT(relative_error(d16, d32), 2e-2);
}

// kStatistics saves each row's maximum and sum and recomputes the probabilities in backward: bit-identical to
// saving the probabilities in float32, in both compute precisions (bf16 compute reads the same rounded q, k, v
// whether qkv was saved in float32 or bfloat16), and (B, H, T, 2) floats instead of (B, H, T, T).
TEST(Attention, SavedStatisticsGiveTheSameGradientsAsSavedProbabilities) {
  for (const AttentionCase k : {AttentionCase{2, 7, 12, 3}, AttentionCase{1, 1, 4, 1}, AttentionCase{3, 17, 8, 2},
                                AttentionCase{2, 40, 16, 4}}) {
    for (const DType compute : {DType::float32, DType::bfloat16}) {
      const CausalSelfAttention lean{k.h, compute, AttentionSaves::kStatistics};
      const CausalSelfAttention full{k.h, compute, AttentionSaves::kProbabilities};
      const Tensor qkv = random_qkv(k, 81, 3.0);
      const Tensor dout = randn({k.b, k.t, k.c}, 82, DType::float32);
      Context ctx32, ctx_lean;
      ctx_lean.saved_dtype = compute;  // the recipes: float32 saves under fp32, bfloat16 under bf16 and FP8
      CausalSelfAttention::Saved s_lean, s_full;
      const Tensor y_lean = lean.forward(ctx_lean, qkv, s_lean), y_full = full.forward(ctx32, qkv, s_full);
      EXPECT_TRUE(fp8kit::testing::same_bits(y_lean, y_full));
      EXPECT_EQ(s_lean.probs.numel(), 0);
      ASSERT_EQ(s_lean.stats.shape(), (Shape{k.b, k.h, k.t, 2}));
      EXPECT_EQ(s_lean.stats.dtype(), DType::float32);
      EXPECT_TRUE(fp8kit::testing::same_bits(lean.backward(ctx_lean, dout, s_lean), full.backward(ctx32, dout, s_full)))
          << "T=" << k.t << " compute " << name(compute);
    }
  }
}

// Against probabilities saved in bfloat16 (what the bf16 and FP8 recipes kept before): the softmax gradient then
// used probabilities rounded to bfloat16 (relative error <= 2^-9 each); the recomputed ones are the float32 values.
// The difference stays within that rounding: below 2^-7 of the gradient's norm here.
TEST(Attention, SavedStatisticsAgainstProbabilitiesSavedInBf16) {
  const AttentionCase k{2, 48, 32, 4};
  const CausalSelfAttention lean{k.h, DType::bfloat16, AttentionSaves::kStatistics};
  const CausalSelfAttention full{k.h, DType::bfloat16, AttentionSaves::kProbabilities};
  const Tensor qkv = random_qkv(k, 91, 2.0);
  const Tensor dout = randn({k.b, k.t, k.c}, 92, DType::float32);
  Context ctx;
  ctx.saved_dtype = DType::bfloat16;
  CausalSelfAttention::Saved s_lean, s_full;
  lean.forward(ctx, qkv, s_lean);
  full.forward(ctx, qkv, s_full);
  const Tensor d_lean = lean.backward(ctx, dout, s_lean), d_full = full.backward(ctx, dout, s_full);
  EXPECT_FALSE(fp8kit::testing::same_bits(d_lean, d_full));  // the rounding of the saved probabilities shows
  EXPECT_LT(relative_error(d_lean, d_full), 1.0 / 128);
  // The memory: 2 floats per row instead of T bfloat16 values.
  EXPECT_EQ(s_lean.stats.nbytes() * k.t, s_full.probs.nbytes() * 4);
}

TEST(Attention, ThreadCountDoesNotChangeResults) {
  const int before = num_threads();
  // Large enough (B*H*T*T*hs = 262144) for the library to run its loops on several threads.
  const AttentionCase k{2, 64, 32, 4};
  const Tensor qkv = random_qkv(k, 71);
  const Tensor dout = randn({k.b, k.t, k.c}, 72, DType::float32);
  for (DType compute : {DType::float32, DType::bfloat16}) {
    const CausalSelfAttention attn{k.h, compute};
    Tensor y[2], d[2];
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      CausalSelfAttention::Saved saved;
      y[threads - 1] = attn.forward(Context{}, qkv, saved);
      d[threads - 1] = attn.backward(Context{}, dout, saved);
    }
    EXPECT_TRUE(fp8kit::testing::same_bits(y[0], y[1])) << name(compute);
    EXPECT_TRUE(fp8kit::testing::same_bits(d[0], d[1])) << name(compute);
  }
  set_num_threads(before);
}

TEST(Attention, RecordsProfilerEvents) {
  Profiler profiler;
  Context ctx;
  ctx.profiler = &profiler;
  const AttentionCase k{1, 4, 4, 2};
  CausalSelfAttention::Saved saved;
  const CausalSelfAttention attn{k.h};
  attn.forward(ctx, random_qkv(k, 81), saved);
  attn.backward(ctx, randn({k.b, k.t, k.c}, 82, DType::float32), saved);
  ASSERT_EQ(profiler.events().size(), 2u);
  EXPECT_EQ(profiler.events()[0].name, "attention.forward");
  EXPECT_EQ(profiler.events()[1].name, "attention.backward");
}

TEST(Attention, RejectsBadArguments) {
  CausalSelfAttention::Saved saved;
  const Tensor qkv = randn({2, 3, 12}, 1, DType::float32);                     // C = 4
  EXPECT_THROW(CausalSelfAttention{3}.forward(Context{}, qkv, saved), Error);  // 4 % 3 != 0
  EXPECT_THROW(CausalSelfAttention{0}.forward(Context{}, qkv, saved), Error);
  EXPECT_THROW(CausalSelfAttention{1}.forward(Context{}, randn({2, 3, 10}, 1, DType::float32), saved), Error);
  EXPECT_THROW(CausalSelfAttention{1}.forward(Context{}, randn({6, 12}, 1, DType::float32), saved), Error);
  EXPECT_THROW(CausalSelfAttention{1}.forward(Context{}, qkv.to(DType::bfloat16), saved), Error);
  EXPECT_THROW((CausalSelfAttention{1, DType::float16}.forward(Context{}, qkv, saved)), Error);
  // Backward before forward, with a wrong dout, or with other heads than forward.
  EXPECT_THROW(CausalSelfAttention{2}.backward(Context{}, randn({2, 3, 4}, 1, DType::float32), saved), Error);
  CausalSelfAttention{2}.forward(Context{}, qkv, saved);
  EXPECT_THROW(CausalSelfAttention{2}.backward(Context{}, randn({2, 3, 5}, 1, DType::float32), saved), Error);
  EXPECT_THROW(CausalSelfAttention{1}.backward(Context{}, randn({2, 3, 4}, 1, DType::float32), saved), Error);
  EXPECT_NO_THROW(CausalSelfAttention{2}.backward(Context{}, randn({2, 3, 4}, 1, DType::float32), saved));
}

}  // namespace
}  // namespace fp8kit::nn
