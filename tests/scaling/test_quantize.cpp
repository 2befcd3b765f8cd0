// Scaled quantization at every granularity against a plain element-by-element reference (bit for bit), MX FLOOR
// against RCEIL on crafted blocks, round-trip error bounds, and the diagnostics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "expect_error.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/scaling/analysis.hpp"
#include "fp8kit/scaling/quantize.hpp"
#include "fp8kit/tensor/memory.hpp"

namespace fp8kit {
namespace {

std::vector<float> gaussian(std::size_t n, std::uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng);
  return x;
}

// The reference: for each element, the amax of its block by brute force, the scale formula, then the codec.
ScaledTensor reference_quantize(const std::vector<float>& x, std::int64_t rows, std::int64_t cols,
                                const QuantizeOptions& o) {
  ScaledTensor q;
  q.format = o.format;
  q.overflow = o.overflow;
  q.granularity = o.granularity;
  q.rows = rows;
  q.cols = cols;
  const std::int64_t br = q.block_rows(), bc = q.block_cols(), gr = q.grid_rows(), gc = q.grid_cols();
  std::vector<float> mult(static_cast<std::size_t>(gr * gc));
  q.scale_inv.resize(mult.size());
  for (std::int64_t i = 0; i < gr; ++i) {
    for (std::int64_t j = 0; j < gc; ++j) {
      float a = 0.0f;
      for (std::int64_t r = i * br; r < std::min(rows, (i + 1) * br); ++r) {
        for (std::int64_t c = j * bc; c < std::min(cols, (j + 1) * bc); ++c) {
          const float v = x[static_cast<std::size_t>(r * cols + c)];
          if (std::isfinite(v)) a = std::max(a, std::fabs(v));
        }
      }
      const std::size_t b = static_cast<std::size_t>(i * gc + j);
      if (o.granularity.kind == Granularity::Kind::kMx) {
        const std::uint8_t code = mx_scale_code(a, o.format, o.granularity.mx_mode);
        mult[b] = std::ldexp(1.0f, 127 - code);
        q.scale_inv[b] = std::ldexp(1.0f, code - 127);
      } else {
        mult[b] = compute_scale(a, o.format, o.scale);
        q.scale_inv[b] = 1.0f / mult[b];
      }
    }
  }
  q.data.resize(x.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::size_t i = static_cast<std::size_t>(r * cols + c);
      const float m = mult[static_cast<std::size_t>((r / br) * gc + c / bc)];
      q.data[i] = encode(m == 1.0f ? x[i] : x[i] * m, EncodeSpec{o.format, o.overflow});
    }
  }
  return q;
}

const Granularity kGranularities[] = {Granularity::tensor(),
                                      Granularity::row(),
                                      Granularity::column(),
                                      Granularity::block(1, 128),
                                      Granularity::block(128, 128),
                                      Granularity::block(3, 5),
                                      Granularity::mx(MxScaleMode::kFloor),
                                      Granularity::mx(MxScaleMode::kRceil)};

TEST(Quantize, MatchesReferenceBitForBit) {
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{1, 1},     {1, 3},  {3, 7},   {17, 129},
                                                          {130, 300}, {2, 32}, {64, 33}, {0, 5}};
  for (const auto& [rows, cols] : shapes) {
    auto x = gaussian(static_cast<std::size_t>(rows * cols), static_cast<std::uint32_t>(rows * 1000 + cols), 10.0f);
    if (x.size() > 10) {
      x[3] = 3000.0f;  // an outlier
      x[5] = std::numeric_limits<float>::quiet_NaN();
      x[7] = -std::numeric_limits<float>::infinity();
      x[9] = 1e-7f;
    }
    for (const Granularity& g : kGranularities) {
      for (Format f : {Format::e4m3fn, Format::e5m2, Format::e4m3fnuz}) {
        for (Overflow o : {Overflow::kSaturate, Overflow::kNonSaturating}) {
          const QuantizeOptions options{f, o, g};
          const ScaledTensor got = quantize(MatrixRef{x.data(), rows, cols}, options);
          const ScaledTensor want = reference_quantize(x, rows, cols, options);
          SCOPED_TRACE(g.name() + " " + std::string(name(f)) + " " + std::to_string(rows) + "x" + std::to_string(cols));
          ASSERT_EQ(got.scale_inv.size(), want.scale_inv.size());
          for (std::size_t b = 0; b < got.scale_inv.size(); ++b) ASSERT_EQ(got.scale_inv[b], want.scale_inv[b]) << b;
          ASSERT_EQ(got.data, want.data);
          // dequantize: code * scale_inv of its block
          std::vector<float> back(x.size());
          dequantize(got, back);
          for (std::int64_t r = 0; r < rows; ++r) {
            for (std::int64_t c = 0; c < cols; ++c) {
              const std::size_t i = static_cast<std::size_t>(r * cols + c);
              const float s = got.scale_inv[static_cast<std::size_t>((r / got.block_rows()) * got.grid_cols() +
                                                                     c / got.block_cols())];
              const float want_value = decode_to_float(f, got.data[i]) * s;
              ASSERT_TRUE(back[i] == want_value || (std::isnan(back[i]) && std::isnan(want_value))) << i;
            }
          }
        }
      }
    }
  }
}

// A matrix with rows further apart than its columns (a column slice of a wider one) quantizes as its contiguous
// copy does, codes, scales and diagnostics, at every granularity; amax_blocks too.
TEST(Quantize, StridedRowsMatchTheContiguousCopy) {
  const std::int64_t rows = 131, cols = 257, ld = 300;
  const auto wide = gaussian(static_cast<std::size_t>(rows * ld), 41);
  std::vector<float> packed(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r)
    std::copy(wide.begin() + r * ld, wide.begin() + r * ld + cols, packed.begin() + r * cols);
  const MatrixRef strided(wide.data(), rows, cols, ld), contiguous(packed.data(), rows, cols);
  for (const Granularity& g : kGranularities) {
    const QuantizeOptions o{Format::e4m3fn, Overflow::kSaturate, g};
    QuantDiagnostics ds, dc;
    const ScaledTensor a = quantize(strided, o, &ds), b = quantize(contiguous, o, &dc);
    EXPECT_EQ(a.data, b.data) << g.name();
    EXPECT_EQ(a.scale_inv, b.scale_inv) << g.name();
    EXPECT_EQ(ds.amax, dc.amax) << g.name();
    EXPECT_EQ(ds.sqnr_db, dc.sqnr_db) << g.name();
    EXPECT_EQ(ds.saturated_count, dc.saturated_count) << g.name();
  }
  const ScaledTensor given = quantize_with_scale(strided, Format::e5m2, 3.0f);
  EXPECT_EQ(given.data, quantize_with_scale(contiguous, Format::e5m2, 3.0f).data);
  std::vector<float> sa(9), sc(9);  // a 3 x 3 grid of 64 x 128 blocks
  AmaxResult ta, tc;
  amax_blocks(strided, 64, 128, sa, &ta);
  amax_blocks(contiguous, 64, 128, sc, &tc);
  EXPECT_EQ(sa, sc);
  EXPECT_EQ(ta.amax, tc.amax);
}

TEST(Quantize, RoundTripErrorWithinHalfAnUlp) {
  // Gaussian data, no outliers: every element within range; relative error <= 2^-(m+1) above the normal range.
  const std::int64_t rows = 64, cols = 256;
  const auto x = gaussian(static_cast<std::size_t>(rows * cols), 77, 5.0f);
  for (const Granularity& g : kGranularities) {
    for (Format f : {Format::e4m3fn, Format::e5m2}) {
      QuantDiagnostics d;
      const ScaledTensor q = quantize(MatrixRef{x.data(), rows, cols}, QuantizeOptions{f, Overflow::kSaturate, g}, &d);
      std::vector<float> back(x.size());
      dequantize(q, back);
      const double half_ulp = std::ldexp(1.0, -(descriptor(f).mantissa_bits + 1));
      for (std::size_t i = 0; i < x.size(); ++i) {
        const std::int64_t r = static_cast<std::int64_t>(i) / cols, c = static_cast<std::int64_t>(i) % cols;
        const float s =
            q.scale_inv[static_cast<std::size_t>((r / q.block_rows()) * q.grid_cols() + c / q.block_cols())];
        const double scaled = std::fabs(x[i]) / s;  // where the element sat in FP8 units
        if (scaled < min_normal(f) || g.kind == Granularity::Kind::kMx) continue;
        ASSERT_LE(std::fabs(back[i] - x[i]), half_ulp * std::fabs(x[i]) * 1.0001)
            << g.name() << " " << name(f) << " " << i;
      }
      // Only MX with FLOOR scales can clip the top of a block; every other scale maps amax to at most fp8_max.
      if (!(g.kind == Granularity::Kind::kMx && g.mx_mode == MxScaleMode::kFloor)) {
        EXPECT_EQ(d.saturated_count, 0u) << g.name() << " " << name(f);
      }
      EXPECT_EQ(d.nonfinite_count, 0u);
      ASSERT_TRUE(d.sqnr_db.has_value());
      // e4m3 keeps ~31 dB on Gaussian data at any granularity; e5m2 ~25 dB.
      EXPECT_GT(*d.sqnr_db, f == Format::e4m3fn ? 28.0 : 22.0) << g.name() << " " << name(f);
    }
  }
}

TEST(Quantize, MxFloorClipsWhereRceilDoesNot) {
  // One 32-element block whose amax is 500: FLOOR picks 2^(floor(log2 500) - 8) = 1, so 500 clips to 448;
  // RCEIL picks 500/448 rounded up to 2, and nothing clips.
  std::vector<float> x(32, 1.0f);
  x[7] = 500.0f;
  QuantDiagnostics floor_d, rceil_d;
  const ScaledTensor floor_q =
      quantize(MatrixRef{x.data(), 1, 32}, {Format::e4m3fn, Overflow::kSaturate, Granularity::mx(MxScaleMode::kFloor)},
               &floor_d);
  const ScaledTensor rceil_q =
      quantize(MatrixRef{x.data(), 1, 32}, {Format::e4m3fn, Overflow::kSaturate, Granularity::mx(MxScaleMode::kRceil)},
               &rceil_d);
  ASSERT_EQ(floor_q.scale_e8m0.size(), 1u);
  EXPECT_EQ(floor_q.scale_e8m0[0], 127);
  EXPECT_EQ(rceil_q.scale_e8m0[0], 128);
  EXPECT_EQ(floor_q.data[7], 0x7E);  // clipped to 448
  EXPECT_EQ(floor_d.saturated_count, 1u);
  EXPECT_EQ(rceil_d.saturated_count, 0u);
  std::vector<float> back(32);
  dequantize(rceil_q, back);
  EXPECT_EQ(back[7], 512.0f);  // 250 rounds to 256 in e4m3fn, times 2
  dequantize(floor_q, back);
  EXPECT_EQ(back[7], 448.0f);
  // Where amax / 448 is exactly a power of two both agree; crafted codes for both modes.
  EXPECT_EQ(mx_scale_code(448.0f, Format::e4m3fn, MxScaleMode::kFloor), 127);
  EXPECT_EQ(mx_scale_code(448.0f, Format::e4m3fn, MxScaleMode::kRceil), 127);
  EXPECT_EQ(mx_scale_code(449.0f, Format::e4m3fn, MxScaleMode::kRceil), 128);
  EXPECT_EQ(mx_scale_code(1.0f, Format::e4m3fn, MxScaleMode::kFloor), 119);  // 2^(0 - 8)
  EXPECT_EQ(mx_scale_code(1.0f, Format::e5m2, MxScaleMode::kFloor), 112);    // 2^(0 - 15)
  EXPECT_EQ(mx_scale_code(0.0f, Format::e4m3fn, MxScaleMode::kFloor), 0x00);
  EXPECT_EQ(mx_scale_code(std::numeric_limits<float>::quiet_NaN(), Format::e4m3fn, MxScaleMode::kRceil), 0xFF);
  EXPECT_EQ(mx_scale_code(std::numeric_limits<float>::infinity(), Format::e4m3fn, MxScaleMode::kRceil), 0xFE);
  EXPECT_EQ(mx_scale_code(1e-44f, Format::e4m3fn, MxScaleMode::kRceil), 0x00);  // clamps at 2^-127
  EXPECT_EQ(mx_scale_code(3e38f, Format::e4m3fn, MxScaleMode::kFloor), 127 + 127 - 8);
}

TEST(Quantize, MxScalesAtTheExponentEdges) {
  // One block per amax, in two rows: the smallest normal amaxes (FLOOR clamps the code at 0; for RCEIL amax / 448 is
  // a float subnormal, which takes the block-by-block path), then amaxes whose amax / 448 is normal too (the
  // vectorized path of both modes): powers of two and their neighbours up to the largest float. Each row also with
  // a zero block (block by block). Against mx_scale_code and the element-by-element reference.
  const std::vector<float> tiny = {0x1p-126f, 0x1.8p-126f, 0x1p-120f, 0x1p-118f, 0x1.fffffep-117f};
  const std::vector<float> normal = {0x1p-116f, 0x1.8p-110f, 1.0f,     448.0f, 449.0f,
                                     57344.0f,  0x1p100f,    0x1p127f, 3e38f,  std::numeric_limits<float>::max()};
  for (const std::vector<float>& amaxes : {tiny, normal}) {
    const auto blocks = static_cast<std::int64_t>(amaxes.size());
    for (bool with_zero_block : {false, true}) {
      std::vector<float> x(static_cast<std::size_t>(32 * (blocks + 1)), 0.0f);
      for (std::int64_t b = 0; b < blocks; ++b) {
        const float a = amaxes[static_cast<std::size_t>(b)];
        for (std::int64_t i = 0; i < 32; ++i)
          x[static_cast<std::size_t>(32 * b + i)] = a * (i % 3 == 0 ? -0.5f : 0.25f);
        x[static_cast<std::size_t>(32 * b + 5)] = b % 2 == 0 ? a : -a;
      }
      const std::int64_t cols = 32 * (blocks + (with_zero_block ? 1 : 0));
      for (Format f : {Format::e4m3fn, Format::e5m2}) {
        for (MxScaleMode mode : {MxScaleMode::kFloor, MxScaleMode::kRceil}) {
          const QuantizeOptions o{f, Overflow::kSaturate, Granularity::mx(mode)};
          const ScaledTensor q = quantize(MatrixRef{x.data(), 1, cols}, o);
          const ScaledTensor want = reference_quantize(std::vector<float>(x.begin(), x.begin() + cols), 1, cols, o);
          SCOPED_TRACE(std::string(name(f)) + (mode == MxScaleMode::kRceil ? " rceil" : " floor") +
                       (with_zero_block ? " with a zero block" : "") + (blocks == 5 ? " (tiny)" : " (normal)"));
          for (std::int64_t b = 0; b < blocks; ++b) {
            const float a = amaxes[static_cast<std::size_t>(b)];
            EXPECT_EQ(q.scale_e8m0[static_cast<std::size_t>(b)], mx_scale_code(a, f, mode)) << a;
          }
          EXPECT_EQ(q.scale_inv, want.scale_inv);
          EXPECT_EQ(q.data, want.data);
        }
      }
    }
  }
}

TEST(Quantize, BlockScalesFollowTheFormulaForEveryOption) {
  // Per-block scales by the scale formula, on blocks that take every branch of compute_scale: ordinary ones (the
  // vectorized path), a zero block, one whose scale overflows to FLT_MAX (below epsilon where there is one), one
  // whose amax is FLT_MAX (the scale is 448 / FLT_MAX), and with a margin or power-of-two rounding (block by
  // block). Against the element-by-element reference.
  const std::int64_t rows = 3, cols = 640;
  auto x = gaussian(static_cast<std::size_t>(rows * cols), 5, 50.0f);
  for (std::int64_t c = 128; c < 256; ++c) x[static_cast<std::size_t>(cols + c)] = 0.0f;
  for (std::int64_t c = 256; c < 384; ++c) x[static_cast<std::size_t>(c)] = 1e-37f;  // 448 / 1e-37 overflows: FLT_MAX
  x[static_cast<std::size_t>(2 * cols + 500)] = std::numeric_limits<float>::max();
  const ScaleOptions variants[] = {{},
                                   {0, 1e-12f, ScaleRounding::kExact},
                                   {2, 0.0f, ScaleRounding::kExact},
                                   {0, 0.0f, ScaleRounding::kPowerOfTwoDown}};
  for (const ScaleOptions& scale : variants) {
    for (bool without_specials : {true, false}) {
      std::vector<float> input = x;
      if (without_specials) {
        for (std::int64_t c = 128; c < 256; ++c) input[static_cast<std::size_t>(cols + c)] = 1.0f;
        for (std::int64_t c = 256; c < 384; ++c) input[static_cast<std::size_t>(c)] = 1.0f;
        input[static_cast<std::size_t>(2 * cols + 500)] = 2.0f;
      }
      for (const Granularity& g : {Granularity::block(1, 128), Granularity::block(2, 128)}) {
        const QuantizeOptions o{Format::e4m3fn, Overflow::kSaturate, g, scale};
        const ScaledTensor got = quantize(MatrixRef{input.data(), rows, cols}, o);
        const ScaledTensor want = reference_quantize(input, rows, cols, o);
        SCOPED_TRACE(g.name() + " margin " + std::to_string(scale.margin) + " epsilon " +
                     std::to_string(scale.epsilon) + (without_specials ? "" : " with special blocks"));
        EXPECT_EQ(got.scale_inv, want.scale_inv);
        EXPECT_EQ(got.data, want.data);
      }
    }
  }
}

TEST(Quantize, OverflowThresholds) {
  // The smallest magnitude that rounds past the largest finite value: e4m3fn's 464 ties to even 448, so the next
  // float; e5m2's 61440 ties up to 65536; e4m3fnuz's 248 ties up (240 is odd); e8m0fnu rounds ties up from 1.5 * 2^127.
  EXPECT_EQ(overflow_threshold(Format::e4m3fn), std::nextafter(464.0f, INFINITY));
  EXPECT_EQ(overflow_threshold(Format::e5m2), 61440.0f);
  EXPECT_EQ(overflow_threshold(Format::e4m3fnuz), 248.0f);
  EXPECT_EQ(overflow_threshold(Format::e5m2fnuz), 61440.0f);
  EXPECT_EQ(overflow_threshold(Format::e8m0fnu), 0x1.8p127f);
  for (Format f : kAllFormats) {
    const float t = overflow_threshold(f);
    const EncodeSpec nonsat{f, Overflow::kNonSaturating};
    EXPECT_NE(decode_to_float(f, encode(t, nonsat)), decode_to_float(f, encode(std::nextafter(t, 0.0f), nonsat)));
    EXPECT_TRUE(std::isfinite(decode_to_float(f, encode(std::nextafter(t, 0.0f), nonsat)))) << name(f);
  }
}

TEST(Quantize, WithAGivenScaleMeasuresAsQuantizeDoes) {
  // A per-tensor scale given (delayed scaling) against quantize() at the scale it computes itself: the same codes,
  // scale and diagnostics when the two scales agree; with a scale twice as large, the values past 448 saturate and
  // are counted.
  const std::int64_t rows = 64, cols = 96;
  auto x = gaussian(static_cast<std::size_t>(rows * cols), 21, 40.0f);
  x[10] = std::numeric_limits<float>::quiet_NaN();
  x[11] = 1e-9f;  // underflows
  QuantDiagnostics computed, given;
  const ScaledTensor q = quantize(MatrixRef{x.data(), rows, cols}, {Format::e4m3fn, Overflow::kSaturate}, &computed);
  ASSERT_TRUE(computed.scale.has_value());
  const float scale = *computed.scale;
  const ScaledTensor g =
      quantize_with_scale(MatrixRef{x.data(), rows, cols}, Format::e4m3fn, scale, Overflow::kSaturate, &given);
  EXPECT_EQ(g.data, q.data);
  EXPECT_EQ(g.scale_inv, q.scale_inv);
  EXPECT_EQ(given.scale, computed.scale);
  EXPECT_EQ(given.amax, computed.amax);
  EXPECT_EQ(given.nonfinite_count, 1u);
  EXPECT_EQ(given.underflow_count, computed.underflow_count);
  EXPECT_GE(given.underflow_count, 1u);
  EXPECT_EQ(given.saturated_count, 0u);
  EXPECT_EQ(given.sqnr_db, computed.sqnr_db);
  QuantDiagnostics doubled;
  const ScaledTensor h =
      quantize_with_scale(MatrixRef{x.data(), rows, cols}, Format::e4m3fn, 2.0f * scale, Overflow::kSaturate, &doubled);
  std::size_t past = 0;
  for (float v : x) past += std::isfinite(v) && std::fabs(v * 2.0f * scale) >= 464.0f ? 1 : 0;
  EXPECT_GT(past, 0u);
  EXPECT_EQ(doubled.saturated_count, past);
  EXPECT_EQ(h.scale_inv[0], 1.0f / (2.0f * scale));
  // An empty matrix has an empty block grid: no scale (as quantize gives it).
  EXPECT_TRUE(quantize_with_scale(MatrixRef(static_cast<const float*>(nullptr), 0, 5), Format::e4m3fn, scale)
                  .scale_inv.empty());
}

TEST(Quantize, Diagnostics) {
  // Per tensor with one outlier: small values underflow, nothing saturates, the scale is reported.
  std::vector<float> x = {1e4f, 1e-3f, -1e-3f, 0.0f, 1.0f, std::numeric_limits<float>::quiet_NaN(), 2.0f, -5e-4f};
  QuantDiagnostics d;
  quantize(MatrixRef{x.data(), 1, 8}, {Format::e4m3fn, Overflow::kSaturate, Granularity::tensor()}, &d);
  EXPECT_EQ(d.amax, 1e4f);
  ASSERT_TRUE(d.scale.has_value());
  EXPECT_EQ(*d.scale, 448.0f / 1e4f);
  EXPECT_EQ(d.count, 8u);
  EXPECT_EQ(d.nonfinite_count, 1u);
  EXPECT_EQ(d.nonzero_finite, 6u);
  EXPECT_EQ(d.underflow_count, 3u);  // 1e-3 * 0.0448 = 4.5e-5 < 2^-10: flushed to zero (and 5e-4)
  EXPECT_NEAR(d.underflow_fraction(), 0.5, 1e-12);
  EXPECT_EQ(d.saturated_count, 0u);
  EXPECT_GT(d.max_rel_error, 0.99);  // the flushed ones lost everything
  // Per row of the same data with a per-row scale: no scale for the whole tensor.
  QuantDiagnostics dr;
  quantize(MatrixRef{x.data(), 2, 4}, {Format::e4m3fn, Overflow::kSaturate, Granularity::row()}, &dr);
  EXPECT_FALSE(dr.scale.has_value());
  // Exactly representable data comes back exactly; SQNR is then undefined (no noise): none.
  std::vector<float> exact = {1.0f, 2.0f, 448.0f, -0.5f};
  QuantDiagnostics de;
  quantize(MatrixRef{exact.data(), 1, 4}, {Format::e4m3fn, Overflow::kSaturate, Granularity::tensor()}, &de);
  EXPECT_TRUE(de.exact);
  EXPECT_FALSE(de.sqnr_db.has_value());
  EXPECT_EQ(de.max_abs_error, 0.0);
  // Saturation counted with a margin that pushes values out of range (scale 2x too large).
  QuantDiagnostics ds;
  quantize(MatrixRef{exact.data(), 1, 4},
           {Format::e4m3fn, Overflow::kSaturate, Granularity::tensor(), ScaleOptions{-1}}, &ds);
  EXPECT_EQ(ds.saturated_count, 1u);  // 448 * 2 > 448
}

TEST(Quantize, GranularityNames) {
  for (const Granularity& g : kGranularities) {
    const auto parsed = Granularity::parse(g.name());
    ASSERT_TRUE(parsed.has_value()) << g.name();
    EXPECT_EQ(parsed->name(), g.name());
  }
  EXPECT_EQ(Granularity::parse("block:1x128")->block_cols, 128);
  EXPECT_FALSE(Granularity::parse("block:0x128").has_value());
  EXPECT_FALSE(Granularity::parse("block:1x").has_value());
  EXPECT_FALSE(Granularity::parse("blocks").has_value());
  EXPECT_FALSE(Granularity::parse("mx16").has_value());
  // Block sides up to 2^31: a larger one (9223372036854775807 overflowed the grid's arithmetic) is not a granularity.
  EXPECT_FALSE(Granularity::parse("block:1x9223372036854775807").has_value());
  EXPECT_FALSE(Granularity::parse("block:2147483649x1").has_value());
  EXPECT_EQ(Granularity::parse("block:1x2147483648")->block_cols, Granularity::kMaxBlockSide);
}

// A block larger than the matrix is one block along that side; a hand-built block with a side of 0 (the default
// Granularity{kBlock}) is refused in one line instead of dividing by zero.
TEST(Quantize, BlockSidesOutOfRangeAreRefusedAndHugeOnesAreOneBlock) {
  EXPECT_EQ(ceil_div(std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::max()), 1);
  EXPECT_EQ(ceil_div(6, std::numeric_limits<std::int64_t>::max()), 1);
  EXPECT_EQ(ceil_div(0, 5), 0);
  EXPECT_EQ(ceil_div(129, 128), 2);
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};
  const ScaledTensor q = quantize(MatrixRef{x.data(), 2, 3},
                                  {Format::e4m3fn, Overflow::kSaturate, *Granularity::parse("block:1x2147483648")});
  EXPECT_EQ(q.grid_rows(), 2);
  EXPECT_EQ(q.grid_cols(), 1);
  const ScaledTensor per_row =
      quantize(MatrixRef{x.data(), 2, 3}, {Format::e4m3fn, Overflow::kSaturate, Granularity::row()});
  EXPECT_TRUE(std::equal(q.data.begin(), q.data.end(), per_row.data.begin(), per_row.data.end()));
  EXPECT_TRUE(std::equal(q.scale_inv.begin(), q.scale_inv.end(), per_row.scale_inv.begin(), per_row.scale_inv.end()));
  for (const Granularity& bad :
       {Granularity::block(1, 0), Granularity::block(0, 0), Granularity{Granularity::Kind::kBlock},
        Granularity::block(1, Granularity::kMaxBlockSide + 1)}) {
    // What scaled_mm asks of a hand-built operand (it divided by zero there).
    ScaledTensor hand_built = q;
    hand_built.granularity = bad;
    testing::expect_error([&] { (void)hand_built.grid_cols(); }, ErrorKind::kInvalidArgument,
                          {"each side must be 1..2147483648"}, bad.name());
    testing::expect_error(
        [&] {
          quantize(MatrixRef{x.data(), 2, 3}, {Format::e4m3fn, Overflow::kSaturate, bad});
        },
        ErrorKind::kInvalidArgument, {"block"}, bad.name());
  }
}

// An error on one of quantize's threads (here the memory limit, refusing a chunk's scales: bfloat16 rows are widened
// and quantized a chunk at a time, each chunk's scales tensor storage) reaches the caller as an exception: it does
// not end the process, as anything thrown out of an OpenMP region would. Nothing stays counted afterwards (the
// chunk's scales were a thread_local kept for the thread's life).
TEST(Quantize, AnErrorOnItsThreadsReachesTheCaller) {
  const std::int64_t rows = 65536, cols = 64;
  std::vector<std::uint16_t> x(static_cast<std::size_t>(rows * cols), bfloat16::from_float(1.5f).bits);
  const QuantizeOptions options{Format::e4m3fn, Overflow::kSaturate, Granularity::row()};
  const MatrixRef in(x.data(), DType::bfloat16, rows, cols, cols);
  const std::int64_t before = memory_stats().current_bytes;
  {
    const ScaledTensor q = quantize(in, options);  // fits: the limit below leaves room for this much and no more
    EXPECT_EQ(q.scale_inv.size(), static_cast<std::size_t>(rows));
  }
  EXPECT_EQ(memory_stats().current_bytes, before);
  // The codes and the scales of the result, and 1 KiB: a chunk's own scales do not fit beside them.
  set_memory_limit(before + rows * cols + rows * 4 + 1024);
  testing::expect_error([&] { (void)quantize(in, options); }, ErrorKind::kUnsupported, {"out of memory"});
  set_memory_limit(0);
  EXPECT_EQ(memory_stats().current_bytes, before);
}

// bfloat16 and float16 matrices quantize as their float32 widening does, bit for bit, at every granularity, with rows
// further apart than their columns, over several of the 1 MiB chunks they are widened in (a short last one, 128-row
// bands) and threads; quantize_codes_into writes the same codes where it is told and the same scales.
TEST(Quantize, SixteenBitInputsMatchTheirFloat32Widening) {
  const std::int64_t rows = 300, cols = 1100, ld = 1111;  // 330 k elements: two chunks of 238 or 256 rows
  auto values = gaussian(static_cast<std::size_t>(rows * ld), 77, 30.0f);
  values[5] = std::numeric_limits<float>::quiet_NaN();
  values[2000] = std::numeric_limits<float>::infinity();
  values[3000] = 1e-30f;
  for (DType dtype : {DType::bfloat16, DType::float16}) {
    std::vector<std::uint16_t> narrow(values.size());
    std::vector<float> widened(static_cast<std::size_t>(rows * cols));
    for (std::size_t i = 0; i < values.size(); ++i) {
      narrow[i] = dtype == DType::bfloat16 ? bfloat16::from_float(values[i]).bits : float16::from_float(values[i]).bits;
    }
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) {
        const std::uint16_t b = narrow[static_cast<std::size_t>(r * ld + c)];
        widened[static_cast<std::size_t>(r * cols + c)] =
            dtype == DType::bfloat16 ? bfloat16{b}.to_float() : float16{b}.to_float();
      }
    }
    for (const Granularity& g : kGranularities) {
      for (Overflow o : {Overflow::kSaturate, Overflow::kNonSaturating}) {
        const QuantizeOptions options{Format::e4m3fn, o, g};
        SCOPED_TRACE(g.name() + " " + std::string(name(dtype)));
        const MatrixRef x(narrow.data(), dtype, rows, cols, ld);
        const ScaledTensor got = quantize(x, options);
        const ScaledTensor want = quantize(MatrixRef{widened.data(), rows, cols}, options);
        ASSERT_EQ(got.data, want.data);
        ASSERT_EQ(got.scale_inv, want.scale_inv);
        ASSERT_EQ(got.scale_e8m0, want.scale_e8m0);
        EXPECT_EQ(got.original_dtype, dtype);
        std::vector<std::uint8_t> codes(static_cast<std::size_t>(rows * cols), 0xAB);
        ScaledTensor scales;
        quantize_codes_into(x, options, codes, scales);
        ASSERT_TRUE(std::equal(codes.begin(), codes.end(), want.data.begin()));
        ASSERT_EQ(scales.scale_inv, want.scale_inv);
        EXPECT_TRUE(scales.data.empty());
        QuantDiagnostics dn, dw;
        quantize(x, options, &dn);
        quantize(MatrixRef{widened.data(), rows, cols}, options, &dw);
        EXPECT_EQ(dn.sqnr_db, dw.sqnr_db);
        // The input's amax and non-finite counts from the amax pass, whichever call and width (one NaN, one Inf).
        float finite_amax = 0.0f;
        for (float v : widened) finite_amax = std::isfinite(v) ? std::max(finite_amax, std::fabs(v)) : finite_amax;
        for (int path = 0; path < 6; ++path) {
          const MatrixRef in = path % 2 == 0 ? x : MatrixRef{widened.data(), rows, cols};
          AmaxResult stats;
          ScaledTensor q;
          if (path < 2) quantize_into(in, options, q, nullptr, &stats);
          if (path >= 2 && path < 4) quantize_codes_into(in, options, codes, q, &stats);
          if (path >= 4) quantize_scales_into(in, options, q, &stats);
          EXPECT_EQ(stats.nan_count, 1u) << path;
          EXPECT_EQ(stats.inf_count, 1u) << path;
          EXPECT_EQ(stats.amax, finite_amax) << path;
        }
      }
    }
  }
  std::vector<std::uint8_t> small(3);
  ScaledTensor s;
  const std::vector<float> four(4);
  EXPECT_THROW(quantize_codes_into(MatrixRef{four.data(), 2, 2}, {}, small, s), Error);
  const std::vector<double> doubles(4);
  EXPECT_THROW(quantize(MatrixRef{doubles.data(), DType::float64, 2, 2}, {}), Error);
}

TEST(Quantize, RejectsBadArguments) {
  std::vector<float> x(6);
  EXPECT_THROW(quantize(MatrixRef{x.data(), 2, 3}, {Format::e4m3fn, Overflow::kSaturate, Granularity::block(0, 2)}),
               Error);
  EXPECT_THROW(quantize(MatrixRef{x.data(), -1, 3}, {}), Error);
  const ScaledTensor q = quantize(MatrixRef{x.data(), 2, 3}, {});
  std::vector<float> wrong(5);
  EXPECT_THROW(dequantize(q, wrong), Error);
  // e8m0fnu holds MX's scales, not values (no sign, no zero: -1 and 0 came back NaN and 2^-127, and the diagnostics
  // called it exact); a given scale must be finite and positive (0 dequantized through 1 / 0).
  for (const Granularity& g : {Granularity::tensor(), Granularity::row(), Granularity::mx()}) {
    EXPECT_THROW(quantize(MatrixRef{x.data(), 2, 3}, {Format::e8m0fnu, Overflow::kSaturate, g}), Error) << g.name();
  }
  EXPECT_THROW(quantize_with_scale(MatrixRef{x.data(), 2, 3}, Format::e8m0fnu, 1.0f), Error);
  // (0x1p-130: finite and positive, but its 1 / scale is infinite: every code came back NaN)
  for (const float scale :
       {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 0x1p-130f}) {
    EXPECT_THROW(quantize_with_scale(MatrixRef{x.data(), 2, 3}, Format::e4m3fn, scale), Error) << scale;
  }
}

// Outputs of 16 MiB and more take streaming stores for their codes at the AVX-512 levels (a plain store reads the
// line first): the same bits as the element-by-element reference, per row and through the 128x128 pipeline.
TEST(Quantize, LargeOutputsStreamedAreTheReferencesBits) {
  const std::int64_t rows = 4100, cols = 4096;  // 16.02 Mi codes, and a short last 128-row band
  const auto x = gaussian(static_cast<std::size_t>(rows * cols), 17, 3.0f);
  for (const Granularity& g : {Granularity::row(), Granularity::block(128, 128), Granularity::mx()}) {
    const QuantizeOptions o{Format::e4m3fn, Overflow::kSaturate, g};
    const ScaledTensor got = quantize(MatrixRef{x.data(), rows, cols}, o);
    const ScaledTensor want = reference_quantize(x, rows, cols, o);
    EXPECT_TRUE(got.data == want.data) << g.name();
    EXPECT_EQ(got.scale_inv, want.scale_inv) << g.name();
  }
}

TEST(Quantize, LargeParallelMatchesSerial) {
  // 600 rows: five 128-row bands (the last 88 rows) over the threads, so the tall-band pipeline (encode one band
  // while reading the next) meets an uneven split and a short last band.
  const std::int64_t rows = 600, cols = 1024;
  auto x = gaussian(static_cast<std::size_t>(rows * cols), 9, 100.0f);
  // Specials in a few blocks (the SIMD amax redoes those blocks), a zero MX block and a subnormal one (the MX
  // scales' block-by-block path for that row).
  x[70 * cols + 5] = std::numeric_limits<float>::quiet_NaN();
  x[300 * cols + 700] = std::numeric_limits<float>::infinity();
  x[599 * cols + 1023] = -std::numeric_limits<float>::infinity();
  for (std::int64_t c = 64; c < 96; ++c) x[static_cast<std::size_t>(200 * cols + c)] = 0.0f;
  for (std::int64_t c = 128; c < 160; ++c) x[static_cast<std::size_t>(201 * cols + c)] = 1e-40f;
  for (const Granularity& g :
       {Granularity::tensor(), Granularity::row(), Granularity::block(1, 128), Granularity::block(128, 128),
        Granularity::block(64, 256), Granularity::mx(), Granularity::mx(MxScaleMode::kRceil)}) {
    for (Overflow overflow : {Overflow::kSaturate, Overflow::kNonSaturating}) {
      const QuantizeOptions o{Format::e4m3fn, overflow, g};
      const ScaledTensor got = quantize(MatrixRef{x.data(), rows, cols}, o);
      const ScaledTensor want = reference_quantize(x, rows, cols, o);
      EXPECT_EQ(got.data, want.data) << g.name();
      EXPECT_EQ(got.scale_inv, want.scale_inv) << g.name();
    }
  }
}

TEST(Quantize, StreamingSizesMatchReference) {
  // 64 MiB of float32: the fused encode and the segmented decode write with non-temporal stores from 16 MiB up,
  // where the output is 64-byte aligned. The codes are in ScaledTensor's aligned buffer (streamed); the decode
  // output once aligned (streamed) and once 4 bytes past it (plain stores).
  const std::int64_t rows = 4096, cols = 4096;
  const auto x = gaussian(static_cast<std::size_t>(rows * cols), 11, 3.0f);
  TensorBuffer<float> buffer;  // on tensor storage: 64-byte aligned
  buffer.resize(x.size() + 1);
  ASSERT_EQ(reinterpret_cast<std::uintptr_t>(buffer.data()) % 64, 0u);
  for (const Granularity& g : {Granularity::block(128, 128), Granularity::mx()}) {
    const QuantizeOptions o{Format::e5m2, Overflow::kSaturate, g};
    const ScaledTensor got = quantize(MatrixRef{x.data(), rows, cols}, o);
    ASSERT_EQ(reinterpret_cast<std::uintptr_t>(got.data.data()) % 64, 0u);
    const ScaledTensor want = reference_quantize(x, rows, cols, o);
    ASSERT_EQ(got.data, want.data) << g.name();
    ASSERT_EQ(got.scale_inv, want.scale_inv) << g.name();
    for (std::size_t offset : {0, 1}) {
      const std::span<float> back(buffer.data() + offset, x.size());
      dequantize(got, back);
      std::size_t mismatches = 0;
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t c = 0; c < cols; ++c) {
          const auto i = static_cast<std::size_t>(r * cols + c);
          const float s =
              got.scale_inv[static_cast<std::size_t>((r / got.block_rows()) * got.grid_cols() + c / got.block_cols())];
          mismatches += back[i] == decode_to_float(o.format, got.data[i]) * s ? 0 : 1;
        }
      }
      EXPECT_EQ(mismatches, 0u) << g.name() << ", output offset " << offset;
    }
  }
}

// analyze's verdict: among the rows that hold, the fewest scales for the tensor's shape, then the kind (a one-block
// grid is per tensor), then SQNR; the scale counts are those of the quantization.
TEST(Analysis, BestHoldingIsTheFewestScales) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(256 * 1024);
  for (float& v : w) v = normal(rng);
  const MatrixRef x{w.data(), 256, 1024};
  const std::vector<Format> formats{Format::e4m3fn};
  const std::vector<Granularity> granularities{Granularity::column(), Granularity::row(), Granularity::block(128, 128),
                                               Granularity::mx()};
  const std::vector<AnalysisRow> rows = analyze(x, formats, granularities);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].scales, 1024);
  EXPECT_EQ(rows[1].scales, 256);
  EXPECT_EQ(rows[2].scales, 16);
  EXPECT_EQ(rows[3].scales, 256 * 32);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_TRUE(rows[i].holds()) << rows[i].granularity.name();
  ASSERT_NE(best_holding(rows), nullptr);
  EXPECT_EQ(best_holding(rows)->granularity.name(), "block:128x128");
  // equal counts: tensor before a block that covers the whole tensor; equal kinds: the better SQNR
  const std::vector<Granularity> whole{Granularity::block(256, 1024), Granularity::tensor()};
  const std::vector<AnalysisRow> tie = analyze(x, formats, whole);
  EXPECT_EQ(tie[0].scales, 1);
  EXPECT_EQ(tie[1].scales, 1);
  EXPECT_EQ(best_holding(tie)->granularity.name(), "tensor");
  std::vector<AnalysisRow> by_hand(2, tie[0]);
  by_hand[0].d.sqnr_db = 30.0;
  by_hand[1].d.sqnr_db = 31.0;
  EXPECT_EQ(best_holding(by_hand), &by_hand[1]);
  // a row that does not hold is never chosen, however few its scales
  by_hand[1].d.saturated_count = 1;
  EXPECT_EQ(best_holding(by_hand), &by_hand[0]);
  // an empty tensor stores no scale at any granularity: the kind decides
  const std::vector<AnalysisRow> empty = analyze(MatrixRef{w.data(), 0, 1024}, formats, whole);
  EXPECT_EQ(empty[0].scales, 0);
  EXPECT_EQ(empty[1].scales, 0);
  EXPECT_EQ(best_holding(empty)->granularity.name(), "tensor");
  // An empty matrix of 2^62 rows (a crafted .npy file's shape): analyze looped over them (forever, per tensor) or
  // sized a vector by them (per row); no pass over its rows now, and no scale.
  const MatrixRef tall(static_cast<const float*>(nullptr), std::int64_t{1} << 62, 0);
  const std::vector<AnalysisRow> nothing = analyze(tall, formats, default_analysis_granularities());
  for (const AnalysisRow& r : nothing)
    EXPECT_TRUE(r.scales == 0 && r.d.exact && r.d.count == 0) << r.granularity.name();
  const ScaledTensor q = quantize(tall, QuantizeOptions{Format::e4m3fn, Overflow::kSaturate, Granularity::tensor()});
  std::vector<float> out;
  dequantize(q, out);  // no pass either
  EXPECT_TRUE(q.scale_inv.empty() && q.data.empty());
  const std::vector<bfloat16> narrow(4);  // widen_rows into nothing: a null output wrote through null
  EXPECT_THROW(widen_rows(MatrixRef(narrow.data(), 2, 2), 0, 2, nullptr), Error);
}

}  // namespace
}  // namespace fp8kit
