// LayerNorm, GELU, ReLU, Embedding, residual add and cross-entropy: forward against plain double-precision code,
// every gradient against central finite differences, accumulation, bfloat16 saved activations, thread independence.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numbers>
#include <string>
#include <vector>

#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/nn/layers.hpp"
#include "nn/nn_util.hpp"

namespace fp8kit::nn {
namespace {

// ---------------------------------------------------------------- helpers
//
// How gradients are checked. Each layer has a plain double-precision reference forward below (written from the
// formula, independently of src/nn). The tests check (1) the float32 forward against it, and (2) the float32
// backward against central finite differences of the random linear functional L(x) = sum_i dy_i * y_ref(x)_i,
// evaluated in double through the reference at the same (float-representable) inputs:
//   dL/dx_j ~ (L(x + h e_j) - L(x - h e_j)) / (2h), h = 1e-6 * max(1, |x_j|).
// In double the truncation error is O(h^2) ~ 1e-12 and the rounding error ~ 1e-16 |L| / h ~ 1e-10, so the
// numeric gradient is exact to ~1e-9 and the tolerance only has to absorb float32 rounding in the layer's
// backward (~1e-6 relative): |analytic - numeric| <= 1e-4 + 1e-3 |numeric|. A wrong term in a gradient gives
// errors of order 0.1-1 with these O(1) inputs. Finite differences through the float32 layer itself would need
// h ~ 1e-2 and a 1e-2 tolerance, weak enough to miss small mistakes.
using Vec = std::vector<double>;

Vec to_vec(const Tensor& t) {
  Vec v(static_cast<std::size_t>(t.numel()));
  for (std::int64_t i = 0; i < t.numel(); ++i) v[static_cast<std::size_t>(i)] = t.item_as_double(i);
  return v;
}

Tensor from_vec(const Vec& v, Shape shape) {
  return tensor(std::span<const double>(v), std::move(shape), DType::float32);
}

Tensor random_tensor(Shape shape, std::uint64_t seed, double scale = 1.0, double offset = 0.0) {
  Tensor t = randn(std::move(shape), seed, DType::float32);
  for (float& x : t.span<float>()) x = static_cast<float>(x * scale + offset);
  return t;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences of f at x, every coordinate.
Vec numeric_gradient(const std::function<double(const Vec&)>& f, Vec x) {
  Vec g(x.size());
  for (std::size_t j = 0; j < x.size(); ++j) {
    const double saved = x[j];
    const double h = 1e-6 * std::max(1.0, std::fabs(saved));
    x[j] = saved + h;
    const double up = f(x);
    x[j] = saved - h;
    const double down = f(x);
    x[j] = saved;
    g[j] = (up - down) / (2.0 * h);
  }
  return g;
}

// Elementwise |actual - expected| <= atol + rtol |expected|, reporting the worst element.
void expect_close(const Vec& actual, const Vec& expected, double atol, double rtol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double worst = 0.0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double excess = std::fabs(actual[i] - expected[i]) - (atol + rtol * std::fabs(expected[i]));
    if (!(excess <= worst)) {  // NaN counts as a failure
      worst = std::isnan(excess) ? INFINITY : excess;
      at = i;
    }
  }
  EXPECT_EQ(worst, 0.0) << what << ": element " << at << " is " << actual[at] << ", expected " << expected[at];
}

void expect_grad(const Tensor& analytic, const Vec& numeric, const std::string& what) {
  expect_close(to_vec(analytic), numeric, 1e-4, 1e-3, what);
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// ---------------------------------------------------------------- double references

// x (R, C) -> y (R, C)
Vec ref_layernorm(const Vec& x, const Vec& w, const Vec& b, std::size_t cols, double eps) {
  Vec y(x.size());
  for (std::size_t r = 0; r < x.size() / cols; ++r) {
    double mean = 0.0, var = 0.0;
    for (std::size_t c = 0; c < cols; ++c) mean += x[r * cols + c] / static_cast<double>(cols);
    for (std::size_t c = 0; c < cols; ++c) var += std::pow(x[r * cols + c] - mean, 2) / static_cast<double>(cols);
    for (std::size_t c = 0; c < cols; ++c) {
      y[r * cols + c] = (x[r * cols + c] - mean) / std::sqrt(var + eps) * w[c] + b[c];
    }
  }
  return y;
}

double ref_gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}

// The mean over rows of logsumexp(row) - row[target].
double ref_cross_entropy(const Vec& logits, const std::vector<std::int64_t>& targets, std::size_t vocab) {
  double total = 0.0;
  for (std::size_t r = 0; r < targets.size(); ++r) {
    double max = -INFINITY, sum = 0.0;
    for (std::size_t v = 0; v < vocab; ++v) max = std::max(max, logits[r * vocab + v]);
    for (std::size_t v = 0; v < vocab; ++v) sum += std::exp(logits[r * vocab + v] - max);
    total += max + std::log(sum) - logits[r * vocab + static_cast<std::size_t>(targets[r])];
  }
  return total / static_cast<double>(targets.size());
}

Tensor int_tensor(const std::vector<std::int64_t>& values, Shape shape) {
  Tensor t = empty(std::move(shape), DType::int64);
  std::copy(values.begin(), values.end(), t.data<std::int64_t>());
  return t;
}

// ---------------------------------------------------------------- LayerNorm

LayerNorm random_layernorm(std::int64_t channels, std::uint64_t seed) {
  LayerNorm ln("ln", channels);
  ln.weight.value = random_tensor({channels}, seed, 0.5, 1.0);
  ln.bias.value = random_tensor({channels}, seed + 1, 0.5);
  return ln;
}

TEST(LayerNorm, ForwardMatchesDoubleWithLeadingDimsAndLargeMean) {
  const std::int64_t channels = 17;
  LayerNorm ln = random_layernorm(channels, 1);
  EXPECT_EQ(ln.weight.name, "ln.weight");
  EXPECT_EQ(ln.bias.name, "ln.bias");
  for (const double offset : {0.0, 1e4}) {  // a large mean must not cost precision (double accumulation)
    const Tensor x = random_tensor({2, 3, channels}, 2, 1.0, offset);
    LayerNorm::Saved saved;
    const Tensor y = ln.forward({}, x, saved);
    ASSERT_EQ(y.shape(), x.shape());
    EXPECT_EQ(saved.rstd.shape(), Shape{6});
    const Vec expected = ref_layernorm(to_vec(x), to_vec(ln.weight.value), to_vec(ln.bias.value), 17, ln.eps);
    expect_close(to_vec(y), expected, 2e-5, 1e-5, "layernorm forward, offset " + std::to_string(offset));
  }
}

TEST(LayerNorm, GradientsMatchFiniteDifferences) {
  const std::size_t rows = 4, cols = 7;
  LayerNorm ln = random_layernorm(cols, 3);
  const Tensor x = random_tensor({2, 2, 7}, 4, 1.5, 0.3);
  const Tensor dy = random_tensor({2, 2, 7}, 5);
  LayerNorm::Saved saved;
  ln.forward({}, x, saved);
  const Tensor dx = ln.backward({}, dy, saved);
  const Vec xv = to_vec(x), wv = to_vec(ln.weight.value), bv = to_vec(ln.bias.value), dyv = to_vec(dy);
  const double eps = ln.eps;
  ASSERT_EQ(xv.size(), rows * cols);
  expect_grad(dx, numeric_gradient([&](const Vec& v) { return dot(dyv, ref_layernorm(v, wv, bv, cols, eps)); }, xv),
              "dx");
  expect_grad(ln.weight.grad,
              numeric_gradient([&](const Vec& v) { return dot(dyv, ref_layernorm(xv, v, bv, cols, eps)); }, wv),
              "dweight");
  expect_grad(ln.bias.grad,
              numeric_gradient([&](const Vec& v) { return dot(dyv, ref_layernorm(xv, wv, v, cols, eps)); }, bv),
              "dbias");
}

TEST(LayerNorm, ParameterGradientsAccumulate) {
  LayerNorm ln = random_layernorm(9, 6);
  const Tensor x = random_tensor({5, 9}, 7);
  const Tensor dy = random_tensor({5, 9}, 8);
  LayerNorm::Saved saved;
  ln.forward({}, x, saved);
  const Tensor dx1 = ln.backward({}, dy, saved);
  const Vec w1 = to_vec(ln.weight.grad), b1 = to_vec(ln.bias.grad);
  const Tensor dx2 = ln.backward({}, dy, saved);
  EXPECT_TRUE(bitwise_equal(dx1, dx2));  // dx is returned fresh, never accumulated
  const Vec w2 = to_vec(ln.weight.grad), b2 = to_vec(ln.bias.grad);
  for (std::size_t i = 0; i < w1.size(); ++i) {
    EXPECT_EQ(w2[i], 2.0 * w1[i]) << i;  // g + g is exact
    EXPECT_EQ(b2[i], 2.0 * b1[i]) << i;
  }
}

TEST(LayerNorm, Bfloat16SavedActivationsStayClose) {
  LayerNorm ln32 = random_layernorm(24, 9), ln16 = random_layernorm(24, 9);
  const Tensor x = random_tensor({6, 24}, 10);
  const Tensor dy = random_tensor({6, 24}, 11);
  LayerNorm::Saved s32, s16;
  const Tensor y32 = ln32.forward({}, x, s32);
  const Tensor y16 = ln16.forward({.saved_dtype = DType::bfloat16}, x, s16);
  EXPECT_EQ(s16.x_hat.dtype(), DType::bfloat16);
  EXPECT_TRUE(bitwise_equal(y32, y16));  // only what is saved is rounded
  const Vec dx32 = to_vec(ln32.backward({}, dy, s32));
  const Vec dx16 = to_vec(ln16.backward({.saved_dtype = DType::bfloat16}, dy, s16));
  expect_close(dx16, dx32, 3e-2, 2e-2, "dx with bfloat16 x_hat");
  expect_close(to_vec(ln16.weight.grad), to_vec(ln32.weight.grad), 3e-2, 2e-2, "dweight with bfloat16 x_hat");
}

// FP8 rows (fp8-o2's saved activations): the same forward, x_hat saved as E4M3 with one scale per row (half the
// bytes of bfloat16 plus 4 per row), a backward within a few percent of float32's.
TEST(LayerNorm, Fp8SavedActivationsStayClose) {
  LayerNorm ln32 = random_layernorm(24, 9), ln8 = random_layernorm(24, 9);
  const Tensor x = random_tensor({6, 24}, 10);
  const Tensor dy = random_tensor({6, 24}, 11);
  LayerNorm::Saved s32, s8;
  const Context fp8{.saved_dtype = DType::bfloat16, .fp8_activations = true};
  const Tensor y32 = ln32.forward({}, x, s32);
  const Tensor y8 = ln8.forward(fp8, x, s8);
  EXPECT_EQ(s8.x_hat.dtype(), DType::float8_e4m3fn);
  EXPECT_EQ(s8.x_hat.row_scale_inv.numel(), 6);
  EXPECT_EQ(s8.x_hat.nbytes(), 6 * 24 + 6 * 4);
  EXPECT_TRUE(bitwise_equal(y32, y8));
  expect_close(to_vec(ln8.backward(fp8, dy, s8)), to_vec(ln32.backward({}, dy, s32)), 8e-2, 5e-2, "dx, FP8 x_hat");
  expect_close(to_vec(ln8.weight.grad), to_vec(ln32.weight.grad), 8e-2, 5e-2, "dweight, FP8 x_hat");
}

// save_activation_rows: each row within half an E4M3 step of its values at the row's scale (2^-4 relative, 2^-10 of
// the scale below the normal range); a row of zeros stays zeros; without fp8_activations it is save_activation.
TEST(SavedActivation, Fp8RowsKeepEachRowsRelativePrecision) {
  Tensor x = random_tensor({5, 40}, 21);
  float* v = x.data<float>();
  for (int c = 0; c < 40; ++c) {
    v[40 + c] *= 1e-6f;  // a tiny row keeps its own precision
    v[80 + c] = 0.0f;    // a zero row
    v[120 + c] *= 3e4f;  // a large one
  }
  const SavedActivation s = save_activation_rows({.saved_dtype = DType::bfloat16, .fp8_activations = true}, x);
  const Vec back = to_vec(load_activation(s)), orig = to_vec(x);
  for (std::size_t i = 0; i < orig.size(); ++i) {
    const double scale_inv = s.row_scale_inv.data<float>()[i / 40];
    EXPECT_LE(std::fabs(back[i] - orig[i]),
              std::max(std::ldexp(std::fabs(orig[i]), -4), std::ldexp(scale_inv, -10)) * 1.0001)
        << i;
    if (i / 40 == 2) EXPECT_EQ(back[i], 0.0) << i;
  }
  const SavedActivation plain = save_activation_rows({.saved_dtype = DType::bfloat16}, x);
  EXPECT_EQ(plain.dtype(), DType::bfloat16);
  EXPECT_EQ(plain.row_scale_inv.numel(), 0);
}

TEST(LayerNorm, RejectsWrongShapes) {
  LayerNorm ln("ln", 8);
  LayerNorm::Saved saved;
  EXPECT_THROW(ln.forward({}, zeros({3, 7}), saved), Error);
  ln.forward({}, zeros({3, 8}), saved);
  EXPECT_THROW(ln.backward({}, zeros({4, 8}), saved), Error);
}

// ---------------------------------------------------------------- GELU and ReLU

TEST(Gelu, ForwardMatchesDoubleIncludingSaturation) {
  const Vec values = {-1e30, -50.0, -10.5, -3.0, -1.0, -0.1, 0.0, 0.1, 0.5, 1.0, 2.5, 10.5, 50.0, 1e30};
  const Tensor x = from_vec(values, {static_cast<std::int64_t>(values.size())});
  Gelu::Saved saved;
  const Vec y = to_vec(Gelu::forward({}, x, saved));
  Vec expected;
  for (const double v : to_vec(x)) expected.push_back(ref_gelu(v));
  expect_close(y, expected, 1e-6, 1e-6, "gelu forward");
  // Saturated derivatives are exactly 0 and 1 (no NaN from x^3 overflowing).
  const Vec dx = to_vec(Gelu::backward({}, ones(x.shape()), saved));
  EXPECT_EQ(dx.front(), 0.0);
  EXPECT_EQ(dx.back(), 1.0);
  for (const double d : dx) EXPECT_TRUE(std::isfinite(d));
}

TEST(Gelu, GradientMatchesFiniteDifferences) {
  const Tensor x = random_tensor({3, 11}, 12, 2.0);
  const Tensor dy = random_tensor({3, 11}, 13);
  Gelu::Saved saved;
  Gelu::forward({}, x, saved);
  const Tensor dx = Gelu::backward({}, dy, saved);
  const Vec dyv = to_vec(dy);
  const auto loss = [&](const Vec& v) {
    double s = 0.0;
    for (std::size_t i = 0; i < v.size(); ++i) s += dyv[i] * ref_gelu(v[i]);
    return s;
  };
  expect_grad(dx, numeric_gradient(loss, to_vec(x)), "gelu dx");
}

TEST(Gelu, Bfloat16SavedInputStaysClose) {
  const Tensor x = random_tensor({4, 33}, 14, 2.0);
  const Tensor dy = random_tensor({4, 33}, 15);
  Gelu::Saved s32, s16;
  Gelu::forward({}, x, s32);
  Gelu::forward({.saved_dtype = DType::bfloat16}, x, s16);
  EXPECT_EQ(s16.x.dtype(), DType::bfloat16);
  expect_close(to_vec(Gelu::backward({}, dy, s16)), to_vec(Gelu::backward({}, dy, s32)), 2e-2, 2e-2,
               "gelu dx with bfloat16 x");
}

TEST(Gelu, Fp8SavedInputStaysClose) {
  const Tensor x = random_tensor({4, 33}, 14, 2.0);
  const Tensor dy = random_tensor({4, 33}, 15);
  Gelu::Saved s32, s8;
  const Context fp8{.saved_dtype = DType::bfloat16, .fp8_activations = true};
  Gelu::forward({}, x, s32);
  const Tensor y8 = Gelu::forward(fp8, x, s8);
  EXPECT_EQ(s8.x.dtype(), DType::float8_e4m3fn);
  // The backward reads the codes through a table and each row's scale: the same values load_activation gives.
  const Tensor loaded = load_activation(s8.x);
  Gelu::Saved from_loaded;
  Gelu::forward({}, loaded, from_loaded);
  EXPECT_TRUE(bitwise_equal(Gelu::backward(fp8, dy, s8), Gelu::backward({}, dy, from_loaded)));
  expect_close(to_vec(Gelu::backward(fp8, dy, s8)), to_vec(Gelu::backward({}, dy, s32)), 1e-1, 5e-2,
               "gelu dx with FP8 x");
}

TEST(Gelu, InPlaceBackwardWritesOverAnUnsharedGradientOnly) {
  const Tensor x = random_tensor({4, 40}, 16, 3.0);
  Gelu::Saved saved;
  Gelu::forward({}, x, saved);
  const Tensor expected = Gelu::backward({}, random_tensor({4, 40}, 17), saved);
  // Handed over and unshared: dx is written over dy's storage, with the same values.
  Tensor dy = random_tensor({4, 40}, 17);
  const std::byte* storage = dy.raw();
  const Tensor dx = Gelu::backward({}, std::move(dy), saved);
  EXPECT_EQ(dx.raw(), storage);
  EXPECT_EQ(to_vec(dx), to_vec(expected));
  // Shared with another tensor: that tensor keeps its values.
  const Tensor kept = random_tensor({4, 40}, 17);
  Tensor shared = kept;
  const Tensor dx2 = Gelu::backward({}, std::move(shared), saved);
  EXPECT_FALSE(dx2.shares_storage_with(kept));
  EXPECT_EQ(to_vec(kept), to_vec(random_tensor({4, 40}, 17)));
  EXPECT_EQ(to_vec(dx2), to_vec(expected));
}

// Forward over a handed-over input: in place when the saved copy is bfloat16 (the float32 input is then dead),
// never when the saved tensor is the input itself (float32 saving); the values are the same either way.
TEST(Gelu, InPlaceForwardOnlyWhenTheSavedCopyIsSeparate) {
  const Tensor x = random_tensor({4, 40}, 18, 3.0);
  Gelu::Saved s_ref;
  const Tensor expected = Gelu::forward({}, x, s_ref);
  Tensor a = x.clone();
  const std::byte* storage_a = a.raw();
  Gelu::Saved s16;
  const Tensor y16 = Gelu::forward({.saved_dtype = DType::bfloat16}, std::move(a), s16);
  EXPECT_EQ(y16.raw(), storage_a);
  EXPECT_EQ(to_vec(y16), to_vec(expected));
  EXPECT_EQ(to_vec(s16.x.values), to_vec(x.to(DType::bfloat16)));  // saved before being overwritten
  Tensor b = x.clone();
  Gelu::Saved s32;
  const Tensor y32 = Gelu::forward({}, std::move(b), s32);
  EXPECT_FALSE(y32.shares_storage_with(s32.x.values));
  EXPECT_EQ(to_vec(s32.x.values), to_vec(x));
  EXPECT_EQ(to_vec(y32), to_vec(expected));
}

// The vectorizable exp behind GELU and the attention softmax: within 2 ulp of the correctly rounded e^x over its
// whole range (every 2039th float32 bit pattern in [-87, 88]), clamped outside it, NaN kept.
TEST(ExpApprox, WithinTwoUlpOverTheRangeClampedOutsideNanKept) {
  auto ulp_distance = [](float a, float b) {
    const auto key = [](float f) {
      const auto u = std::bit_cast<std::int32_t>(f);
      return u < 0 ? std::int64_t{INT32_MIN} - u : std::int64_t{u};
    };
    return std::llabs(key(a) - key(b));
  };
  long long worst = 0;
  std::int64_t checked = 0;
  for (std::uint64_t bits = 0; bits < (std::uint64_t{1} << 32); bits += 2039) {
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(bits));
    if (!(x >= -87.0f && x <= 88.0f)) continue;
    const float exact = static_cast<float>(std::exp(static_cast<double>(x)));
    worst = std::max(worst, ulp_distance(detail::exp_approx(x), exact));
    ++checked;
  }
  EXPECT_GT(checked, 1000000) << "floats checked";
  EXPECT_LE(worst, 2) << "worst distance in ulp";
  EXPECT_EQ(detail::exp_approx(0.0f), 1.0f);
  EXPECT_EQ(detail::exp_approx(-1000.0f), detail::exp_approx(-87.0f));
  EXPECT_EQ(detail::exp_approx(1000.0f), detail::exp_approx(88.0f));
  EXPECT_EQ(detail::exp_approx(-INFINITY), detail::exp_approx(-87.0f));
  EXPECT_TRUE(std::isnan(detail::exp_approx(NAN)));
}

TEST(Relu, ForwardBackwardAndFiniteDifferences) {
  Tensor x = random_tensor({5, 13}, 16);
  for (float& v : x.span<float>()) {
    if (std::fabs(v) < 1e-2f) v = 0.5f;  // keep finite differences away from the kink
  }
  const Tensor dy = random_tensor({5, 13}, 17);
  Relu::Saved saved;
  const Vec y = to_vec(Relu::forward({.saved_dtype = DType::bfloat16}, x, saved));  // the mask is exact anyway
  const Vec xv = to_vec(x), dyv = to_vec(dy);
  for (std::size_t i = 0; i < xv.size(); ++i) EXPECT_EQ(y[i], std::max(xv[i], 0.0)) << i;
  const Tensor dx = Relu::backward({}, dy, saved);
  const auto loss = [&](const Vec& v) {
    double s = 0.0;
    for (std::size_t i = 0; i < v.size(); ++i) s += dyv[i] * std::max(v[i], 0.0);
    return s;
  };
  expect_grad(dx, numeric_gradient(loss, xv), "relu dx");
}

TEST(Relu, ZeroHasZeroGradientAndNanPropagates) {
  const Tensor x = from_vec({0.0, -0.0, NAN, 2.0}, {4});
  Relu::Saved saved;
  const Vec y = to_vec(Relu::forward({}, x, saved));
  EXPECT_EQ(y[0], 0.0);
  EXPECT_TRUE(std::isnan(y[2]));
  EXPECT_EQ(y[3], 2.0);
  const Vec dx = to_vec(Relu::backward({}, ones({4}), saved));
  EXPECT_EQ(dx, (Vec{0.0, 0.0, 0.0, 1.0}));
}

// ---------------------------------------------------------------- Embedding

TEST(Embedding, LookupAndScatterAddWithRepeatedIds) {
  Embedding emb("wte", 6, 5, 0.02, 18);
  EXPECT_EQ(emb.weight.name, "wte.weight");
  const std::vector<std::int64_t> ids = {3, 0, 3, 5, 3, 1};
  const Tensor id = int_tensor(ids, {2, 3});
  Embedding::Saved saved;
  const Tensor y = emb.forward({}, id, saved);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 5}));
  const Vec table = to_vec(emb.weight.value), yv = to_vec(y);
  for (std::size_t n = 0; n < ids.size(); ++n)
    for (std::size_t c = 0; c < 5; ++c) EXPECT_EQ(yv[n * 5 + c], table[static_cast<std::size_t>(ids[n]) * 5 + c]);

  const Tensor dy = random_tensor({2, 3, 5}, 19);
  emb.backward({}, dy, saved);
  const Vec dyv = to_vec(dy);
  const auto loss = [&](const Vec& w) {
    double s = 0.0;
    for (std::size_t n = 0; n < ids.size(); ++n)
      for (std::size_t c = 0; c < 5; ++c) s += dyv[n * 5 + c] * w[static_cast<std::size_t>(ids[n]) * 5 + c];
    return s;
  };
  Vec numeric = numeric_gradient(loss, table);
  expect_grad(emb.weight.grad, numeric, "embedding dweight");
  // A second backward adds the same again (not bit-exactly 2x: id 3's three rows are summed one by one in float).
  emb.backward({}, dy, saved);
  for (double& g : numeric) g *= 2.0;
  expect_grad(emb.weight.grad, numeric, "embedding dweight after two backwards");
  const Vec g2 = to_vec(emb.weight.grad);
  for (std::size_t c = 0; c < 5; ++c) EXPECT_EQ(g2[2 * 5 + c], 0.0);  // id 2 never looked up
}

TEST(Embedding, RejectsIdsOutOfRangeAndWrongDtype) {
  Embedding emb("e", 4, 3, 0.02, 20);
  Embedding::Saved saved;
  try {
    emb.forward({}, int_tensor({0, 4}, {2}), saved);
    ADD_FAILURE() << "an id equal to the table size was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("id 4 at position 1 is outside [0, 4)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(emb.forward({}, int_tensor({-1}, {1}), saved), Error);
  EXPECT_THROW(emb.forward({}, zeros({2}), saved), Error);  // float ids
}

TEST(TokenPositionEmbedding, ForwardAndGradientsOfBothTables) {
  TokenPositionEmbedding enc("transformer", 7, 5, 4, 0.5, 21);
  const std::vector<Parameter*> params = enc.parameters();
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params[0]->name, "transformer.wte.weight");
  EXPECT_EQ(params[1]->name, "transformer.wpe.weight");
  const std::vector<std::int64_t> tokens = {6, 2, 6, 2, 0, 6};  // (B=2, T=3), repeats across and within rows
  TokenPositionEmbedding::Saved saved;
  const Tensor y = enc.forward({}, int_tensor(tokens, {2, 3}), saved);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 4}));
  const Vec wte = to_vec(enc.wte.weight.value), wpe = to_vec(enc.wpe.weight.value);
  const auto ref = [&](const Vec& te, const Vec& pe) {
    Vec out(tokens.size() * 4);
    for (std::size_t n = 0; n < tokens.size(); ++n)
      for (std::size_t c = 0; c < 4; ++c)
        out[n * 4 + c] = te[static_cast<std::size_t>(tokens[n]) * 4 + c] + pe[(n % 3) * 4 + c];
    return out;
  };
  expect_close(to_vec(y), ref(wte, wpe), 0.0, 1e-7, "token + position forward");
  const Tensor dy = random_tensor({2, 3, 4}, 22);
  enc.backward({}, dy, saved);
  const Vec dyv = to_vec(dy);
  expect_grad(enc.wte.weight.grad, numeric_gradient([&](const Vec& v) { return dot(dyv, ref(v, wpe)); }, wte), "dwte");
  expect_grad(enc.wpe.weight.grad, numeric_gradient([&](const Vec& v) { return dot(dyv, ref(wte, v)); }, wpe), "dwpe");
  EXPECT_THROW(enc.forward({}, int_tensor(std::vector<std::int64_t>(6, 0), {1, 6}), saved), Error);  // T > 5
}

// ---------------------------------------------------------------- residual add

TEST(ResidualAdd, SumsAndPassesTheGradientToBoth) {
  const Tensor a = random_tensor({3, 5}, 23), b = random_tensor({3, 5}, 24);
  ResidualAdd::Saved saved;
  const Tensor y = ResidualAdd::forward({}, a, b, saved);
  const Vec av = to_vec(a), bv = to_vec(b), yv = to_vec(y);
  for (std::size_t i = 0; i < yv.size(); ++i) EXPECT_EQ(yv[i], static_cast<double>(static_cast<float>(av[i] + bv[i])));
  const Tensor dy = random_tensor({3, 5}, 25);
  const ResidualAdd::Grads g = ResidualAdd::backward({}, dy, saved);
  EXPECT_TRUE(bitwise_equal(g.da, dy));
  EXPECT_TRUE(bitwise_equal(g.db, dy));
  EXPECT_THROW(ResidualAdd::forward({}, a, zeros({5, 3}), saved), Error);
  EXPECT_THROW(ResidualAdd::backward({}, zeros({15}), saved), Error);
}

// ---------------------------------------------------------------- cross-entropy

TEST(CrossEntropy, UniformLogitsGiveLogV) {
  for (const std::int64_t vocab : {1, 2, 50257}) {
    const Tensor logits = full({3, vocab}, 1.25);  // any constant
    CrossEntropy::Saved saved;
    const float loss = CrossEntropy::forward({}, logits, int_tensor({0, vocab - 1, vocab / 2}, {3}), saved);
    EXPECT_NEAR(loss, std::log(static_cast<double>(vocab)), 1e-5) << vocab;
    // dlogits = (1/V - onehot) / R
    const Vec d = to_vec(CrossEntropy::backward({}, 1.0f, saved));
    EXPECT_NEAR(d[0], (1.0 / vocab - 1.0) / 3.0, 1e-7);
    if (vocab > 1) EXPECT_NEAR(d[1], 1.0 / vocab / 3.0, 1e-6 / vocab);
  }
}

TEST(CrossEntropy, ForwardAndGradientMatchDouble) {
  const std::size_t vocab = 9;
  const Tensor logits = random_tensor({2, 3, 9}, 26, 3.0);
  const std::vector<std::int64_t> targets = {8, 0, 4, 4, 1, 7};
  CrossEntropy::Saved saved;
  const float loss = CrossEntropy::forward({}, logits, int_tensor(targets, {2, 3}), saved);
  const Vec lv = to_vec(logits);
  EXPECT_NEAR(loss, ref_cross_entropy(lv, targets, vocab), 1e-6);
  const float dloss = 0.7f;  // a loss scale
  const Tensor dlogits = CrossEntropy::backward({}, dloss, saved);
  ASSERT_EQ(dlogits.shape(), logits.shape());
  expect_grad(dlogits, numeric_gradient([&](const Vec& v) { return dloss * ref_cross_entropy(v, targets, vocab); }, lv),
              "dlogits");
  // Stable for large logits: shifting a row changes nothing.
  Tensor shifted = logits.clone();
  for (float& v : shifted.span<float>()) v += 1000.0f;
  CrossEntropy::Saved s2;
  EXPECT_NEAR(CrossEntropy::forward({}, shifted, int_tensor(targets, {2, 3}), s2), loss, 1e-3);
}

// Handed its saved state, backward writes dlogits over the saved float32 logits when nothing else holds them (no
// second R x V tensor), with the bits of the copying backward; logits the caller still holds are not touched.
TEST(CrossEntropy, HandedOverBackwardWritesOverTheLogitsBitForBit) {
  const Tensor targets = int_tensor({3, 0, 39, 17, 5, 3}, {6});
  CrossEntropy::Saved kept, handed, shared;
  Tensor logits = random_tensor({6, 40}, 28, 2.0);
  const Tensor copy = logits.clone();
  ASSERT_EQ(CrossEntropy::forward({}, logits, targets, kept), CrossEntropy::forward({}, copy, targets, shared));
  const Tensor want = CrossEntropy::backward({}, 0.7f, kept);
  kept = {};
  CrossEntropy::forward({}, logits, targets, handed);
  logits = Tensor();  // the saved state holds the only reference
  const void* where = handed.logits.raw();
  const Tensor got = CrossEntropy::backward({}, 0.7f, std::move(handed));
  EXPECT_EQ(got.raw(), where);  // over the logits
  EXPECT_EQ(handed.logits.numel(), 0);
  ASSERT_EQ(got.nbytes(), want.nbytes());
  EXPECT_EQ(std::memcmp(got.raw(), want.raw(), static_cast<std::size_t>(want.nbytes())), 0);
  const Tensor before = copy.clone();
  const Tensor also = CrossEntropy::backward({}, 0.7f, std::move(shared));  // `copy` still holds these logits
  EXPECT_NE(also.raw(), copy.raw());
  EXPECT_EQ(std::memcmp(copy.raw(), before.raw(), static_cast<std::size_t>(copy.nbytes())), 0);
  EXPECT_EQ(std::memcmp(also.raw(), want.raw(), static_cast<std::size_t>(want.nbytes())), 0);
}

TEST(CrossEntropy, Bfloat16SavedLogitsStayCloseAndRowsSumToZero) {
  const Tensor logits = random_tensor({4, 40}, 27, 2.0);
  const Tensor targets = int_tensor({0, 39, 17, 5}, {4});
  CrossEntropy::Saved s32, s16;
  const float l32 = CrossEntropy::forward({}, logits, targets, s32);
  const float l16 = CrossEntropy::forward({.saved_dtype = DType::bfloat16}, logits, targets, s16);
  EXPECT_EQ(l32, l16);  // the loss uses the exact logits
  EXPECT_EQ(s16.logits.dtype(), DType::bfloat16);
  const Vec d32 = to_vec(CrossEntropy::backward({}, 1.0f, s32));
  const Vec d16 = to_vec(CrossEntropy::backward({}, 1.0f, s16));
  expect_close(d16, d32, 2e-3, 2e-2, "dlogits with bfloat16 logits");
  for (std::size_t r = 0; r < 4; ++r) {  // softmax recomputed from the saved logits still sums to 1
    double sum = 0.0;
    for (std::size_t v = 0; v < 40; ++v) sum += d16[r * 40 + v];
    EXPECT_NEAR(sum, 0.0, 1e-6) << r;
  }
}

TEST(CrossEntropy, RejectsTargetsOutOfRangeOrMisshaped) {
  CrossEntropy::Saved saved;
  const Tensor logits = zeros({2, 5});
  try {
    CrossEntropy::forward({}, logits, int_tensor({1, 5}, {2}), saved);
    ADD_FAILURE() << "target 5 accepted for V = 5";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target 5 at position 1 is outside [0, 5)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(CrossEntropy::forward({}, logits, int_tensor({-1, 0}, {2}), saved), Error);
  EXPECT_THROW(CrossEntropy::forward({}, logits, int_tensor({0, 0, 0}, {3}), saved), Error);
  EXPECT_THROW(CrossEntropy::forward({}, logits, zeros({2}), saved), Error);
}

// ---------------------------------------------------------------- threads and profiler

// Everything a layer computes, at a size where every loop goes parallel, for one thread count.
std::vector<Tensor> run_all_layers(int threads) {
  set_num_threads(threads);
  std::vector<Tensor> out;
  const Tensor x = random_tensor({256, 160}, 30, 1.5, 0.2);
  const Tensor dy = random_tensor({256, 160}, 31);
  LayerNorm ln = random_layernorm(160, 32);
  LayerNorm::Saved ls;
  out.push_back(ln.forward({}, x, ls));
  out.push_back(ln.backward({}, dy, ls));
  out.push_back(ln.weight.grad);
  out.push_back(ln.bias.grad);
  Gelu::Saved gs;
  out.push_back(Gelu::forward({}, x, gs));
  out.push_back(Gelu::backward({}, dy, gs));
  Relu::Saved rs;
  out.push_back(Relu::forward({}, x, rs));
  out.push_back(Relu::backward({}, dy, rs));
  ResidualAdd::Saved as;
  out.push_back(ResidualAdd::forward({}, x, dy, as));
  std::vector<std::int64_t> tokens(512);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int64_t>((i * 7919) % 37);
  TokenPositionEmbedding enc("t", 37, 128, 160, 0.02, 33);
  TokenPositionEmbedding::Saved es;
  out.push_back(enc.forward({}, int_tensor(tokens, {4, 128}), es));
  enc.backward({}, random_tensor({4, 128, 160}, 34), es);
  out.push_back(enc.wte.weight.grad);
  out.push_back(enc.wpe.weight.grad);
  CrossEntropy::Saved cs;
  std::vector<std::int64_t> targets(256);
  for (std::size_t i = 0; i < targets.size(); ++i) targets[i] = static_cast<std::int64_t>((i * 31) % 160);
  out.push_back(scalar_tensor(CrossEntropy::forward({}, x, int_tensor(targets, {256}), cs), DType::float32));
  out.push_back(CrossEntropy::backward({}, 1.0f, cs));
  return out;
}

TEST(NnLayerThreads, ResultsAreBitIdenticalForOneAndTwoThreads) {
  const int before = num_threads();
  const std::vector<Tensor> one = run_all_layers(1);
  const std::vector<Tensor> two = run_all_layers(2);
  set_num_threads(before);
  ASSERT_EQ(one.size(), two.size());
  for (std::size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(bitwise_equal(one[i], two[i])) << "result " << i;
}

TEST(NnLayerProfiler, EveryForwardAndBackwardRecordsAnEvent) {
  Profiler profiler;
  const Context ctx{.profiler = &profiler};
  LayerNorm ln("ln", 4);
  LayerNorm::Saved ls;
  const Tensor x = random_tensor({2, 4}, 35);
  ln.backward(ctx, ln.forward(ctx, x, ls), ls);
  Gelu::Saved gs;
  Gelu::backward(ctx, Gelu::forward(ctx, x, gs), gs);
  Relu::Saved rs;
  Relu::backward(ctx, Relu::forward(ctx, x, rs), rs);
  ResidualAdd::Saved as;
  ResidualAdd::backward(ctx, ResidualAdd::forward(ctx, x, x, as), as);
  Embedding emb("e", 3, 4, 0.02, 36);
  Embedding::Saved es;
  emb.backward(ctx, emb.forward(ctx, int_tensor({0, 2}, {2}), es), es);
  TokenPositionEmbedding enc("t", 3, 2, 4, 0.02, 37);
  TokenPositionEmbedding::Saved ts;
  enc.backward(ctx, enc.forward(ctx, int_tensor({0, 2}, {1, 2}), ts), ts);
  CrossEntropy::Saved cs;
  CrossEntropy::forward(ctx, x, int_tensor({0, 3}, {2}), cs);
  CrossEntropy::backward(ctx, 1.0f, cs);
  std::vector<std::string> names;
  for (const ProfileEvent& e : profiler.events()) names.push_back(e.name);
  const std::vector<std::string> expected = {"layernorm.forward",
                                             "layernorm.backward",
                                             "gelu.forward",
                                             "gelu.backward",
                                             "relu.forward",
                                             "relu.backward",
                                             "residual.forward",
                                             "residual.backward",
                                             "embedding.forward",
                                             "embedding.backward",
                                             "token_position_embedding.forward",
                                             "token_position_embedding.backward",
                                             "cross_entropy.forward",
                                             "cross_entropy.backward"};
  EXPECT_EQ(names, expected);
}

}  // namespace
}  // namespace fp8kit::nn
