// The reference scaled_mm: exact on integer-valued inputs against FP64, bounded error on random inputs, every scale
// granularity and both B layouts agreeing, odd shapes, and the refused combinations.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "fp8kit/common/error.hpp"
#include "fp8kit/ops/scaled_mm.hpp"
#include "fp8kit/tensor/memory.hpp"

namespace fp8kit {
namespace {

std::vector<float> random_matrix(std::int64_t rows, std::int64_t cols, std::uint32_t seed, bool integers) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> small(-8, 8);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> v(static_cast<std::size_t>(rows * cols));
  for (auto& x : v) x = integers ? static_cast<float>(small(rng)) : normal(rng);
  return v;
}

std::vector<float> transpose(const std::vector<float>& x, std::int64_t rows, std::int64_t cols) {
  std::vector<float> t(x.size());
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j)
      t[static_cast<std::size_t>(j * rows + i)] = x[static_cast<std::size_t>(i * cols + j)];
  return t;
}

// FP64 product of the dequantized operands (what the FP8 values and scales represent).
std::vector<double> reference64(const ScaledTensor& a, const ScaledTensor& b_nk) {
  std::vector<float> da(a.data.size()), db(b_nk.data.size());
  dequantize(a, da);
  dequantize(b_nk, db);
  const std::int64_t m = a.rows, k = a.cols, n = b_nk.rows;
  std::vector<double> out(static_cast<std::size_t>(m * n), 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t kk = 0; kk < k; ++kk)
        s += double{da[static_cast<std::size_t>(i * k + kk)]} * db[static_cast<std::size_t>(j * k + kk)];
      out[static_cast<std::size_t>(i * n + j)] = s;
    }
  return out;
}

TEST(ScaledMm, IntegerInputsAreExact) {
  // Small integers are exact in e4m3fn; per-tensor scales of powers of two keep everything exact in FP32.
  for (auto [m, k, n] : {std::tuple{1, 1, 1}, std::tuple{3, 17, 5}, std::tuple{17, 129, 3}, std::tuple{8, 256, 16}}) {
    const auto x = random_matrix(m, k, 1, true), w = random_matrix(n, k, 2, true);
    const ScaledTensor a =
        quantize(MatrixRef{x.data(), m, k}, {Format::e4m3fn, Overflow::kSaturate, Granularity::tensor(),
                                             ScaleOptions{0, 0.0f, ScaleRounding::kPowerOfTwoDown}});
    const ScaledTensor b =
        quantize(MatrixRef{w.data(), n, k}, {Format::e4m3fn, Overflow::kSaturate, Granularity::tensor(),
                                             ScaleOptions{0, 0.0f, ScaleRounding::kPowerOfTwoDown}});
    const ScaledMmResult r = scaled_mm_reference(a, b);
    const auto want = reference64(a, b);
    for (std::size_t i = 0; i < want.size(); ++i) ASSERT_EQ(static_cast<double>(r.out[i]), want[i]) << i;
    // and the dequantized integers are the original ones
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::int64_t kk = 0; kk < k; ++kk)
          s += double{x[static_cast<std::size_t>(i * k + kk)]} * w[static_cast<std::size_t>(j * k + kk)];
        ASSERT_EQ(static_cast<double>(r.out[static_cast<std::size_t>(i * n + j)]), s);
      }
  }
}

TEST(ScaledMm, EveryGranularityAndLayoutWithinBound) {
  const std::int64_t m = 17, k = 300, n = 129;
  const auto x = random_matrix(m, k, 3, false), w = random_matrix(n, k, 4, false);
  const auto wt = transpose(w, n, k);  // K x N
  const Granularity a_grans[] = {Granularity::tensor(), Granularity::row(), Granularity::block(1, 128)};
  const Granularity b_grans[] = {Granularity::tensor(), Granularity::row(), Granularity::block(128, 128)};
  for (const Granularity& ga : a_grans) {
    for (const Granularity& gb : b_grans) {
      for (Format fa : {Format::e4m3fn, Format::e5m2}) {
        const Format fb = Format::e4m3fn;
        const ScaledTensor a = quantize(MatrixRef{x.data(), m, k}, {fa, Overflow::kSaturate, ga, {}});
        const ScaledTensor b = quantize(MatrixRef{w.data(), n, k}, {fb, Overflow::kSaturate, gb, {}});
        const ScaledMmResult r = scaled_mm_reference(a, b);
        const auto want = reference64(a, b);
        // FP32 accumulation of k exact products: |error| <= k * 2^-24 * sum |a b| (plus the scale products' rounding)
        for (std::int64_t i = 0; i < m; ++i)
          for (std::int64_t j = 0; j < n; ++j) {
            const std::size_t o = static_cast<std::size_t>(i * n + j);
            double abs_sum = 0;
            for (std::int64_t kk = 0; kk < k; ++kk)
              abs_sum +=
                  std::fabs(double{x[static_cast<std::size_t>(i * k + kk)]} * w[static_cast<std::size_t>(j * k + kk)]);
            ASSERT_NEAR(r.out[o], want[o], (k + 8) * std::ldexp(1.0, -24) * abs_sum * 1.5 + 1e-30)
                << ga.name() << " x " << gb.name() << " " << i << "," << j;
          }
        // B given as K x N with the matching granularity gives the same result.
        const Granularity gb_kn = gb.kind == Granularity::Kind::kRow     ? Granularity::column()
                                  : gb.kind == Granularity::Kind::kBlock ? Granularity::block(128, 128)
                                                                         : gb;
        const ScaledTensor bt = quantize(MatrixRef{wt.data(), k, n}, {fb, Overflow::kSaturate, gb_kn, {}});
        const ScaledMmResult rt = scaled_mm_reference(a, bt, {BLayout::kKN});
        ASSERT_EQ(rt.out, r.out) << ga.name() << " x " << gb.name();
      }
    }
  }
}

TEST(ScaledMm, BiasBfloat16OutputAndAmax) {
  const std::int64_t m = 3, k = 64, n = 5;
  const auto x = random_matrix(m, k, 5, false), w = random_matrix(n, k, 6, false);
  const ScaledTensor a = quantize(MatrixRef{x.data(), m, k}, {});
  const ScaledTensor b = quantize(MatrixRef{w.data(), n, k}, {});
  const std::vector<float> bias = {1.0f, -2.0f, 0.5f, 100.0f, 0.0f};
  const ScaledMmResult f32 = scaled_mm_reference(a, b, {BLayout::kNK, DType::float32, bias});
  const ScaledMmResult plain = scaled_mm_reference(a, b);
  const ScaledMmResult bf16 = scaled_mm_reference(a, b, {BLayout::kNK, DType::bfloat16, bias});
  float amax = 0;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      const std::size_t o = static_cast<std::size_t>(i * n + j);
      EXPECT_EQ(f32.out[o], plain.out[o] + bias[static_cast<std::size_t>(j)]);
      EXPECT_EQ(bf16.out[o], bfloat16::from_float(f32.out[o]).to_float());
      amax = std::max(amax, std::fabs(f32.out[o]));
    }
  EXPECT_EQ(f32.amax, amax);
}

TEST(ScaledMm, MxOperandsWithinBound) {
  // MXFP8: both operands in 1 x 32 blocks along K (E8M0 scales); each 32-element block sum is scaled on its own.
  const std::int64_t m = 5, k = 96, n = 7;
  const auto x = random_matrix(m, k, 11, false), w = random_matrix(n, k, 12, false);
  for (MxScaleMode mode : {MxScaleMode::kFloor, MxScaleMode::kRceil}) {
    const ScaledTensor a =
        quantize(MatrixRef{x.data(), m, k}, {Format::e4m3fn, Overflow::kSaturate, Granularity::mx(mode), {}});
    const ScaledTensor b =
        quantize(MatrixRef{w.data(), n, k}, {Format::e4m3fn, Overflow::kSaturate, Granularity::mx(mode), {}});
    const ScaledMmResult r = scaled_mm_reference(a, b);
    const auto want = reference64(a, b);
    for (std::size_t o = 0; o < want.size(); ++o) {
      // Per 32-element block the FP32 sum is exact to 2^-24 relative per step; scales are powers of two.
      ASSERT_NEAR(r.out[o], want[o], 1e-4 * (1.0 + std::fabs(want[o]))) << o;
    }
  }
}

TEST(ScaledMm, RefusesWhatDoesNotFit) {
  const auto x = random_matrix(4, 256, 7, false);
  const ScaledTensor e4 =
      quantize(MatrixRef{x.data(), 4, 256}, {Format::e4m3fn, Overflow::kSaturate, Granularity::tensor(), {}});
  const ScaledTensor e5 =
      quantize(MatrixRef{x.data(), 4, 256}, {Format::e5m2, Overflow::kSaturate, Granularity::tensor(), {}});
  EXPECT_THROW(scaled_mm_reference(e5, e5), Error);  // e5m2 x e5m2
  EXPECT_NO_THROW(scaled_mm_reference(e4, e5));
  const ScaledTensor k128 = quantize(MatrixRef{x.data(), 2, 128}, {});
  EXPECT_THROW(scaled_mm_reference(e4, k128), Error);  // K 256 vs 128
  const ScaledTensor col =
      quantize(MatrixRef{x.data(), 4, 256}, {Format::e4m3fn, Overflow::kSaturate, Granularity::column(), {}});
  EXPECT_THROW(scaled_mm_reference(col, e4), Error);  // A per column
  const ScaledTensor mx =
      quantize(MatrixRef{x.data(), 4, 256}, {Format::e4m3fn, Overflow::kSaturate, Granularity::mx(), {}});
  EXPECT_NO_THROW(scaled_mm_reference(mx, e4));  // MX: 1 x 32 blocks along K with E8M0 scales
  const ScaledTensor b128x4 =
      quantize(MatrixRef{x.data(), 4, 256}, {Format::e4m3fn, Overflow::kSaturate, Granularity::block(128, 128), {}});
  EXPECT_THROW(scaled_mm_reference(mx, b128x4), Error);  // K blocks 32 vs 128
  // MX on both sides with B as K x N: B's MX blocks run along N; the error says how to lay B out.
  try {
    const ScaledTensor mx_kn =
        quantize(MatrixRef{x.data(), 256, 4}, {Format::e4m3fn, Overflow::kSaturate, Granularity::mx(), {}});
    scaled_mm_reference(mx, mx_kn, {BLayout::kKN});
    ADD_FAILURE() << "mx32 x mx32 with B as K x N was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("quantize B as N x K"), std::string::npos) << e.what();
  }
  ScaledTensor e8 = e4;  // made by hand: quantize refuses e8m0fnu too
  e8.format = Format::e8m0fnu;
  EXPECT_THROW(scaled_mm_reference(e8, e4), Error);  // e8m0fnu is a scale format
  const ScaledTensor a64 =
      quantize(MatrixRef{x.data(), 4, 256}, {Format::e4m3fn, Overflow::kSaturate, Granularity::block(1, 64), {}});
  const ScaledTensor b128 =
      quantize(MatrixRef{x.data(), 4, 256}, {Format::e4m3fn, Overflow::kSaturate, Granularity::block(128, 128), {}});
  EXPECT_THROW(scaled_mm_reference(a64, b128), Error);  // K blocks differ
  EXPECT_THROW(scaled_mm_reference(e4, e4, {BLayout::kNK, DType::float16}), Error);
  const std::vector<float> bias(3);
  EXPECT_THROW(scaled_mm_reference(e4, e4, {BLayout::kNK, DType::float32, bias}), Error);
  // Hand-made shapes: negative, or an output of 2^33 x 2^33 with K = 0 (it was allocated, and segfaulted).
  ScaledTensor negative = e4;
  negative.rows = -4;
  negative.cols = -256;
  ScaledTensor huge = quantize(MatrixRef{x.data(), 0, 0}, {});
  huge.rows = std::int64_t{1} << 33;
  for (const auto* bad : {&negative, &huge}) {
    EXPECT_THROW(scaled_mm_reference(*bad, *bad), Error);
    EXPECT_THROW(scaled_mm(*bad, *bad), Error);
  }
}

// An output that shares memory with an input is refused: the kernels read the inputs while they write it, and from
// K of a few hundred on the result depended on the order of the writes.
TEST(ScaledMm, OutputSharingAnInputIsRefused) {
  const std::int64_t n = 320;
  auto x = random_matrix(n, n, 3, false);
  const auto w = random_matrix(n, n, 4, false);
  const ScaledTensor qw = quantize(MatrixRef{w.data(), n, n}, {});
  const MatrixRef a{x.data(), n, n}, b{w.data(), n, n};
  const std::span<float> aliased(x.data(), x.size());
  for (const auto& call : std::vector<std::function<void()>>{
           [&] { matmul(a, b, BLayout::kNK, aliased); }, [&] { matmul_reference(a, b, BLayout::kNK, aliased); },
           [&] { fp8_weight_mm(a, qw, aliased); }, [&] { fp8_weight_mm_reference(a, qw, aliased); },
           // A over x's second half, the output over x's middle: a partial overlap.
           [&] {
             matmul(MatrixRef{x.data() + n * n / 2, n / 2, n}, b, BLayout::kNK,
                    std::span(x.data() + n * n / 4, n * n / 2));
           }}) {
    try {
      call();
      ADD_FAILURE() << "an aliased output was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("shares memory with"), std::string::npos) << e.what();
    }
  }
  ScaledTensor qa = quantize(MatrixRef{x.data(), n, n}, {});
  std::vector<float> out(static_cast<std::size_t>(n * n));
  EXPECT_NO_THROW(scaled_mm_into(qa, qw, out, {}));  // apart: fine
  EXPECT_NO_THROW(matmul(a, b, BLayout::kNK, out));
}

// ScaledTensorRef: a product over views of memory the caller owns (codes and scales in plain vectors, as a binding's
// arrays) gives the ScaledTensor product's bits on both paths and at every granularity of B, allocates no tensor
// storage for the operands, and is refused when the output shares memory with a view's codes or scales.
QuantizeOptions e4m3fn_at(Granularity g) {
  QuantizeOptions o;
  o.granularity = g;
  return o;
}

TEST(ScaledMm, ViewsOfCallerMemoryAreTheScaledTensorProduct) {
  const std::int64_t k = 256, n = 96;
  for (const std::int64_t m : {std::int64_t{1}, std::int64_t{3}, std::int64_t{40}}) {
    for (const Granularity g : {Granularity::tensor(), Granularity::row(), Granularity::block(128, 128)}) {
      const auto x = random_matrix(m, k, 11, false), w = random_matrix(n, k, 12, false);
      const ScaledTensor qa = quantize(MatrixRef{x.data(), m, k}, e4m3fn_at(Granularity::tensor()));
      const ScaledTensor qw = quantize(MatrixRef{w.data(), n, k}, e4m3fn_at(g));
      // The caller's copies, in memory no ScaledTensor owns.
      const std::vector<std::uint8_t> a_codes(qa.data.begin(), qa.data.end()), w_codes(qw.data.begin(), qw.data.end());
      const std::vector<float> a_scales(qa.scale_inv.begin(), qa.scale_inv.end()),
          w_scales(qw.scale_inv.begin(), qw.scale_inv.end());
      ScaledTensorRef va, vw;
      va.format = vw.format = Format::e4m3fn;
      va.granularity = qa.granularity;
      vw.granularity = qw.granularity;
      va.rows = m;
      va.cols = vw.cols = k;
      vw.rows = n;
      va.data = a_codes;
      vw.data = w_codes;
      va.scale_inv = a_scales;
      vw.scale_inv = w_scales;
      ScaledMmOptions nk;
      nk.b_layout = BLayout::kNK;
      const ScaledMmResult want = scaled_mm(qa, qw, nk);
      const std::int64_t before = memory_stats().current_bytes;
      reset_peak_memory();
      std::vector<float> out(static_cast<std::size_t>(m * n));
      MmDispatch dispatch;
      const float amax = scaled_mm_into(va, vw, out, nk, &dispatch);
      EXPECT_EQ(memory_stats().peak_bytes, before) << "the views were copied into tensor storage";
      EXPECT_EQ(dispatch.path, want.path) << "m " << m;
      EXPECT_EQ(std::memcmp(out.data(), want.out.data(), out.size() * sizeof(float)), 0)
          << "m " << m << ", B " << g.name();
      EXPECT_EQ(amax, want.amax);
      EXPECT_EQ(std::memcmp(scaled_mm_reference(va, vw, nk).out.data(), scaled_mm_reference(qa, qw, nk).out.data(),
                            out.size() * sizeof(float)),
                0);
      std::vector<float> by_weights(out.size()), by_weights_view(out.size());
      fp8_weight_mm(MatrixRef{x.data(), m, k}, qw, by_weights);
      fp8_weight_mm(MatrixRef{x.data(), m, k}, vw, by_weights_view);
      EXPECT_EQ(by_weights, by_weights_view);
      // Sizes are checked as a ScaledTensor's: one code short, one scale short.
      ScaledTensorRef short_codes = vw, short_scales = vw;
      short_codes.data = short_codes.data.first(short_codes.data.size() - 1);
      short_scales.scale_inv = short_scales.scale_inv.first(short_scales.scale_inv.size() - 1);
      EXPECT_THROW(scaled_mm_into(va, short_codes, out, nk), Error);
      EXPECT_THROW(scaled_mm_into(va, short_scales, out, nk), Error);
    }
  }
  // An output over a view's memory is refused (the codes, then the scales).
  const std::int64_t n2 = 64;
  std::vector<float> buffer(static_cast<std::size_t>(n2 * n2 + n2));
  const auto w = random_matrix(n2, n2, 13, false);
  const ScaledTensor qw = quantize(MatrixRef{w.data(), n2, n2}, e4m3fn_at(Granularity::row()));
  ScaledTensorRef view = qw;
  view.data = {reinterpret_cast<const std::uint8_t*>(buffer.data()), static_cast<std::size_t>(n2 * n2)};
  const std::span<float> out(buffer.data() + n2, static_cast<std::size_t>(n2 * n2));
  try {
    scaled_mm_into(view, view, out, {});
    ADD_FAILURE() << "an output over a view's codes was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shares memory with"), std::string::npos) << e.what();
  }
  ScaledTensorRef scales_view = qw;
  scales_view.scale_inv = {buffer.data() + n2 * n2 - 1, static_cast<std::size_t>(n2)};
  EXPECT_THROW(scaled_mm_into(qw, scales_view, std::span(buffer.data(), static_cast<std::size_t>(n2 * n2)), {}), Error);
}

}  // namespace
}  // namespace fp8kit
